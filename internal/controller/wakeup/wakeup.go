// Package wakeup is a source of reconcile requests for code outside the
// informers: the runner and the dispatcher wake the reconcilers through it.
package wakeup

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// Queue is a controller's work queue.
type Queue = workqueue.TypedRateLimitingInterface[ctrl.Request]

// High is the Priority of the wake-ups of Executions and Sessions.
const High = 10

// Source is a source of reconcile requests for code outside the informers
// (the runner, the dispatcher). Waking never blocks and never drops a
// request: before the controller starts they are kept, after it they go
// straight to its work queue, which merges duplicates.
type Source struct {
	// Delay postpones each request, so a burst becomes one reconcile.
	Delay time.Duration
	// Priority puts the requests ahead of the informers' (priority 0) in a
	// controller's priority queue: a wake-up is work that can go on now (a
	// pod was chosen, a run ended), where a burst of new objects only has
	// each say that it waits. Without it a burst of a thousand Executions
	// delays another namespace's run, whose pod is ready, by a thousand
	// reconciles.
	Priority int

	mu    sync.Mutex
	queue Queue
	// pending holds each key once: a source whose controller never starts
	// (a replica that serves only the data plane) keeps one entry per key,
	// not one per wake-up.
	pending map[types.NamespacedName]struct{}
}

// Start implements source.Source.
func (w *Source) Start(_ context.Context, q Queue) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queue = q
	for key := range w.pending {
		w.add(key)
	}
	w.pending = nil
	return nil
}

func (w *Source) String() string { return "wakeups" }

// Wake asks for a reconcile of key.
func (w *Source) Wake(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queue == nil {
		if w.pending == nil {
			w.pending = map[types.NamespacedName]struct{}{}
		}
		w.pending[key] = struct{}{}
		return
	}
	w.add(key)
}

func (w *Source) add(key types.NamespacedName) {
	if pq, ok := w.queue.(priorityqueue.PriorityQueue[ctrl.Request]); ok && w.Priority != 0 {
		pq.AddWithOpts(priorityqueue.AddOpts{After: w.Delay, Priority: &w.Priority}, ctrl.Request{NamespacedName: key})
		return
	}
	if w.Delay > 0 {
		w.queue.AddAfter(ctrl.Request{NamespacedName: key}, w.Delay)
		return
	}
	w.queue.Add(ctrl.Request{NamespacedName: key})
}
