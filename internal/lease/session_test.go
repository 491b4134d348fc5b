package lease

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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

// An Execution's claim of a Session's pod and the mark a suspend puts on it
// exclude each other: the second to write fails, and a marked pod is
// claimable by no Execution.
func TestMarkSuspendingAndAClaimExcludeEachOther(t *testing.T) {
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "ses-1"}}
	ses.Status.PodName, ses.Status.PodUID = "p", "pod-1"
	ex := &sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e", UID: "ex-1"},
		Spec: sandboxv1alpha1.ExecutionSpec{Session: "s"}}
	newPod := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-1",
			Labels:      map[string]string{sandboxpod.LabelSession: "s", sandboxpod.LabelState: sandboxpod.StateBusy},
			Annotations: map[string]string{sandboxpod.AnnotationSessionUID: "ses-1"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	ctx := context.Background()

	// The suspend marks first: the Execution's claim, read before, conflicts; read after, it is refused.
	c := fake.NewClientBuilder().WithObjects(newPod()).Build()
	forSuspend, forClaim := &corev1.Pod{}, &corev1.Pod{}
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, forSuspend)
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, forClaim)
	if err := MarkSuspending(ctx, c, forSuspend, ses); err != nil {
		t.Fatal(err)
	}
	if err := Claim(ctx, c, forClaim, ex); !apierrors.IsConflict(err) {
		t.Errorf("a claim read before the mark: %v, want a conflict", err)
	}
	fresh := &corev1.Pod{}
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, fresh)
	if Claimable(fresh, ex) || !errors.Is(Claim(ctx, c, fresh, ex), ErrNotClaimable) {
		t.Error("a pod marked suspending is claimable by the Session's Execution")
	}

	// The Execution claims first: the mark, read before, conflicts; read after, it is refused.
	c = fake.NewClientBuilder().WithObjects(newPod()).Build()
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, forSuspend)
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, forClaim)
	if err := Claim(ctx, c, forClaim, ex); err != nil {
		t.Fatal(err)
	}
	if err := MarkSuspending(ctx, c, forSuspend, ses); !apierrors.IsConflict(err) {
		t.Errorf("a mark read before the claim: %v, want a conflict", err)
	}
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p"}, fresh)
	if err := MarkSuspending(ctx, c, fresh, ses); !errors.Is(err, ErrNotClaimable) {
		t.Errorf("a mark of a pod a run holds: %v, want ErrNotClaimable", err)
	}
}
