package pool

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func TestCountsWaitForTheIntervalAndConditionsDoNot(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "p"}
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	ready := func(reason string, idle int32) *sandboxv1alpha1.SandboxPoolStatus {
		return &sandboxv1alpha1.SandboxPoolStatus{IdleReplicas: idle, ObservedGeneration: 1, Conditions: []metav1.Condition{
			{Type: sandboxv1alpha1.PoolConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: "idle pods ready"}}}
	}
	var w statusWrites
	cur := ready(sandboxv1alpha1.ReasonIdleReplicasReady, 3)
	if got := w.wait(key, cur, ready(sandboxv1alpha1.ReasonIdleReplicasReady, 2), t0); got != 0 {
		t.Fatalf("first write waits %s, want none", got)
	}
	w.written(key, t0)
	if got := w.wait(key, cur, ready(sandboxv1alpha1.ReasonIdleReplicasReady, 1), t0.Add(300*time.Millisecond)); got != 700*time.Millisecond {
		t.Fatalf("a count 300ms after a write waits %s, want 700ms", got)
	}
	if got := w.wait(key, cur, ready(sandboxv1alpha1.ReasonPodsStarting, 1), t0.Add(300*time.Millisecond)); got != 0 {
		t.Fatalf("a condition's new reason waits %s, want none", got)
	}
	gen := ready(sandboxv1alpha1.ReasonIdleReplicasReady, 1)
	gen.ObservedGeneration = 2
	if got := w.wait(key, cur, gen, t0.Add(300*time.Millisecond)); got != 0 {
		t.Fatalf("a new observed generation waits %s, want none", got)
	}
	if got := w.wait(key, cur, ready(sandboxv1alpha1.ReasonIdleReplicasReady, 1), t0.Add(time.Second)); got != 0 {
		t.Fatalf("a count after the interval waits %s, want none", got)
	}
	scaled := ready(sandboxv1alpha1.ReasonIdleReplicasReady, 3)
	scaled.Autoscaling = &sandboxv1alpha1.PoolAutoscalingStatus{DesiredReplicas: 4, ClaimRate: "1.0"}
	cur.Autoscaling = &sandboxv1alpha1.PoolAutoscalingStatus{DesiredReplicas: 3, ClaimRate: "1.0"}
	if got := w.wait(key, cur, scaled, t0.Add(300*time.Millisecond)); got != 0 {
		t.Fatalf("a new autoscaling decision waits %s, want none", got)
	}
	scaled.Autoscaling.DesiredReplicas, scaled.Autoscaling.ClaimRate = 3, "2.0"
	if got := w.wait(key, cur, scaled, t0.Add(300*time.Millisecond)); got == 0 {
		t.Fatal("a new claim rate alone is written at once, want it to wait")
	}
}
