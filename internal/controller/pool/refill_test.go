package pool

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func busyPods(uids ...string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, u := range uids {
		out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(u)}})
	}
	return out
}

func TestRefillOfAClaimedPodWaitsWhileIdlePodsRemain(t *testing.T) {
	var r refills
	p := types.NamespacedName{Namespace: "ns", Name: "py"}
	t0 := time.Unix(1000, 0)
	if got := r.wait(p, nil, 2, 0, 0, t0); got != 0 {
		t.Fatalf("nothing to create: wait %v", got)
	}
	if got := r.wait(p, busyPods("a"), 1, 0, 1, t0); got != refillDelay {
		t.Fatalf("the replacement of a pod claimed now: wait %v, want %v", got, refillDelay)
	}
	// A second claim 600 ms later: both replacements start when the first is due.
	if got := r.wait(p, busyPods("a", "b"), 1, 0, 2, t0.Add(600*time.Millisecond)); got != 400*time.Millisecond {
		t.Fatalf("after a second claim: wait %v, want 400ms", got)
	}
	// Once the first claim is older than the delay, both start.
	if got := r.wait(p, busyPods("a", "b"), 1, 0, 2, t0.Add(refillDelay)); got != 0 {
		t.Fatalf("at the delay: wait %v, want 0", got)
	}
}

func TestRefillIsImmediateForAnythingButARecentClaim(t *testing.T) {
	var r refills
	p := types.NamespacedName{Namespace: "ns", Name: "py"}
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name    string
		spare   int
		waiting int32
		create  int
	}{
		{"no idle pod left", 0, 0, 1},
		{"only a shared pool's reserve left (idle 2, reserve 3)", -1, 0, 1},
		{"work waiting for a pod", 3, 1, 1},
		{"more pods wanted than were just claimed (spec.replicas, autoscaler, quota)", 3, 0, 2},
	} {
		if got := r.wait(p, busyPods("a"), c.spare, c.waiting, c.create, now); got != 0 {
			t.Errorf("%s: wait %v, want 0", c.name, got)
		}
	}
}
