package pool

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// The status-write policy: a pool's status is written when it changes, but a
// change of counts alone (idle, ready, busy, pending replicas, the Ready
// condition's "N of M" message, the warm-hit ratio) waits until
// statusInterval has passed since the pool's last write, and then goes with
// every count that moved meanwhile. Under a stream of claims each claim moved
// a count, and the pool wrote its status once per claim: as many writes as
// the claims themselves. A change a user or a spec acts on is written at
// once: a condition's status or reason, the observed generation, the label
// selector, the autoscaler's decision.

// statusInterval is the least time between two writes of a pool's counts.
const statusInterval = time.Second

// statusWrites remembers when each pool's status was last written.
type statusWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

// wait returns how long the write of next (over the stored cur) should wait:
// 0 to write now.
func (w *statusWrites) wait(key types.NamespacedName, cur, next *sandboxv1alpha1.SandboxPoolStatus, now time.Time) time.Duration {
	if !countsOnly(cur, next) {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.last[key]; ok {
		return max(t.Add(statusInterval).Sub(now), 0)
	}
	return 0
}

// written records a write of key's status at now.
func (w *statusWrites) written(key types.NamespacedName, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]time.Time{}
	}
	w.last[key] = now
}

// forget drops a deleted pool.
func (w *statusWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}

// countsOnly reports whether next differs from cur only in counts: the same
// conditions (type, status, reason), generation, selector and autoscaling.
func countsOnly(cur, next *sandboxv1alpha1.SandboxPoolStatus) bool {
	if cur.ObservedGeneration != next.ObservedGeneration || cur.Selector != next.Selector ||
		!sameDecision(cur.Autoscaling, next.Autoscaling) || len(cur.Conditions) != len(next.Conditions) {
		return false
	}
	for i := range next.Conditions {
		a, b := cur.Conditions[i], next.Conditions[i]
		if a.Type != b.Type || a.Status != b.Status || a.Reason != b.Reason || a.ObservedGeneration != b.ObservedGeneration {
			return false
		}
	}
	return true
}

// sameDecision reports whether two autoscaling statuses hold the same
// decision (the rates they measured may differ).
func sameDecision(a, b *sandboxv1alpha1.PoolAutoscalingStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.DesiredReplicas == b.DesiredReplicas && a.Reason == b.Reason && equality.Semantic.DeepEqual(a.LastScaleTime, b.LastScaleTime)
}
