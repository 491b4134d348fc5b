package lease

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

func TestHeldByIsTheSessionsOwnPodOnly(t *testing.T) {
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "ses-1"}}
	pod := func(podUID, session, sessionUID string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID(podUID),
			Labels: map[string]string{sandboxpod.LabelSession: session}, Annotations: map[string]string{}}}
		if sessionUID != "" {
			p.Annotations[sandboxpod.AnnotationSessionUID] = sessionUID
		}
		return p
	}
	ready := ses.DeepCopy()
	ready.Status.PodName, ready.Status.PodUID = "p", "pod-1"
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		ses  *sandboxv1alpha1.Session
		want bool
	}{
		{"its pod, while it claims it", pod("pod-1", "s", "ses-1"), ses, true},
		{"its pod, once Ready", pod("pod-1", "s", "ses-1"), ready, true},
		{"a pod of a session from before Session objects", pod("pod-1", "s", ""), ses, true},
		{"another Session of the same name", pod("pod-1", "s", "ses-0"), ses, false},
		{"another session's pod", pod("pod-1", "t", "ses-1"), ses, false},
		// Labels and annotations copied onto a pod made under the gone pod's name.
		{"a look-alike under its pod's name", pod("pod-2", "s", "ses-1"), ready, false},
	} {
		if got := HeldBy(c.pod, c.ses); got != c.want {
			t.Errorf("%s: HeldBy = %v, want %v", c.name, got, c.want)
		}
	}
}
