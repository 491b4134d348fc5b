package pool

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// expectationTTL bounds how long a create or delete is expected: a pod created
// and deleted again before the cache saw it must not block the pool forever.
const expectationTTL = time.Minute

// expectations remembers, per pool, the pods this manager created or deleted
// that the informer cache has not shown yet, so that a lagging cache never
// makes the pool create or delete twice (the ReplicaSet controller's idea).
type expectations struct {
	mu      sync.Mutex
	creates map[types.NamespacedName]map[string]time.Time
	deletes map[types.NamespacedName]map[string]time.Time
	// seen are pods the informer showed before their create was recorded
	// (the watch can be quicker than the create call's return).
	seen map[types.NamespacedName]map[string]time.Time
	// now dates each expectation (the reconciler's clock).
	now func() time.Time
}

func newExpectations(now func() time.Time) *expectations {
	return &expectations{now: now,
		creates: map[types.NamespacedName]map[string]time.Time{},
		deletes: map[types.NamespacedName]map[string]time.Time{},
		seen:    map[types.NamespacedName]map[string]time.Time{},
	}
}

func (e *expectations) add(m map[types.NamespacedName]map[string]time.Time, pool types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m[pool] == nil {
		m[pool] = map[string]time.Time{}
	}
	m[pool][name] = e.now()
}

// Created records a pod created for pool, unless the informer showed it already.
func (e *expectations) Created(pool types.NamespacedName, name string) {
	e.mu.Lock()
	if _, ok := e.seen[pool][name]; ok {
		delete(e.seen[pool], name)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.add(e.creates, pool, name)
}

// Seen settles the create of a pod the informer showed (its creation or its
// deletion). A List settles it too, but a pod created, leased, run and
// deleted between two reconciles is never in a List: its create would have
// been expected, and the pool left short, for expectationTTL.
func (e *expectations) Seen(pool types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.creates[pool][name]; ok {
		delete(e.creates[pool], name)
		return
	}
	if e.seen[pool] == nil {
		e.seen[pool] = map[string]time.Time{}
	}
	e.seen[pool][name] = e.now()
}

// Deleted records a pod deleted for pool.
func (e *expectations) Deleted(pool types.NamespacedName, name string) { e.add(e.deletes, pool, name) }

// Observe settles the expectations against the pods the cache shows (name ->
// terminating) and returns the creates still pending and the set of pods whose
// deletion the cache has not shown yet.
func (e *expectations) Observe(pool types.NamespacedName, pods map[string]bool, now time.Time) (pendingCreates int, deleting map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, at := range e.creates[pool] {
		if _, seen := pods[name]; seen || now.Sub(at) > expectationTTL {
			delete(e.creates[pool], name)
		}
	}
	for name, at := range e.seen[pool] {
		if now.Sub(at) > expectationTTL {
			delete(e.seen[pool], name)
		}
	}
	deleting = map[string]bool{}
	for name, at := range e.deletes[pool] {
		terminating, seen := pods[name]
		if !seen || terminating || now.Sub(at) > expectationTTL {
			delete(e.deletes[pool], name)
			continue
		}
		deleting[name] = true
	}
	return len(e.creates[pool]), deleting
}

// Forget drops a deleted pool.
func (e *expectations) Forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.creates, pool)
	delete(e.deletes, pool)
	delete(e.seen, pool)
}
