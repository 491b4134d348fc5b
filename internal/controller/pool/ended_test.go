package pool

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// endedAt is when the kubelet says the container ended, else when the pod
// stopped being ready, else its creation: the backstop counts from it.
func TestEndedAt(t *testing.T) {
	created := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	unready, finished := created.Add(time.Minute), created.Add(2*time.Minute)
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		mut(p)
		return p
	}
	notReady := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(unready)}}
	}
	for name, c := range map[string]struct {
		p    *corev1.Pod
		want time.Time
	}{
		"terminated": {pod(func(p *corev1.Pod) {
			notReady(p)
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", FinishedAt: metav1.NewTime(finished)}}}}
		}), finished},
		"not ready":   {pod(notReady), unready},
		"nothing yet": {pod(func(*corev1.Pod) {}), created},
	} {
		if got := endedAt(c.p); !got.Equal(c.want) {
			t.Errorf("%s: endedAt = %s, want %s", name, got, c.want)
		}
	}
}
