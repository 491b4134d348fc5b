package pool

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The refill policy. A pool that still has an idle pod starts the
// replacements of pods claimed a moment ago refillDelay after their claim,
// not at once: a gVisor sandbox booting takes a node's cores for a second or
// more, and the moment of a claim is when its caller's first run needs them
// (measured on the local cluster, docs/performance.md). Pods the pool lacks
// for any other reason (a larger spec.replicas, the autoscaler, a quota that
// grew, a pod that failed), a pool with no idle pod left (beyond a shared
// pool's reserve, which is kept for other tenants' first runs), and a pool
// with work waiting start at once.

// refillDelay is how long the replacement of a claimed pod waits while its
// pool has an idle pod left.
const refillDelay = time.Second

// refills remembers when each pool's busy pods were first seen busy.
type refills struct {
	mu   sync.Mutex
	busy map[types.NamespacedName]map[types.UID]time.Time
}

// wait returns how long pool should still wait before it starts the create
// pods it lacks (0: start them now). spare is the idle pods any claim may
// take (those beyond the reserve).
func (r *refills) wait(pool types.NamespacedName, busy []*corev1.Pod, spare int, waiting int32, create int, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy == nil {
		r.busy = map[types.NamespacedName]map[types.UID]time.Time{}
	}
	seen, next := r.busy[pool], make(map[types.UID]time.Time, len(busy))
	recent, earliest := 0, now
	for _, p := range busy {
		t, ok := seen[p.UID]
		if !ok {
			t = now
		}
		next[p.UID] = t
		if now.Sub(t) < refillDelay {
			recent++
			if t.Before(earliest) {
				earliest = t
			}
		}
	}
	r.busy[pool] = next
	if create <= 0 || spare <= 0 || waiting > 0 || create > recent {
		return 0
	}
	return refillDelay - now.Sub(earliest)
}

// forget drops what is remembered of pool.
func (r *refills) forget(pool types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.busy, pool)
}
