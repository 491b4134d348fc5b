package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
)

// wakeups is a source of reconcile requests for code outside the informers
// (the runner, the dispatcher). Waking never blocks and never drops a
// request: before the controller starts they are kept, after it they go
// straight to its work queue, which merges duplicates.
type wakeups struct {
	// delay postpones each request, so a burst becomes one reconcile.
	delay time.Duration

	mu      sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[ctrl.Request]
	pending []types.NamespacedName
}

// Start implements source.Source.
func (w *wakeups) Start(_ context.Context, q workqueue.TypedRateLimitingInterface[ctrl.Request]) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queue = q
	for _, key := range w.pending {
		w.add(key)
	}
	w.pending = nil
	return nil
}

func (w *wakeups) String() string { return "wakeups" }

// Wake asks for a reconcile of key.
func (w *wakeups) Wake(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queue == nil {
		w.pending = append(w.pending, key)
		return
	}
	w.add(key)
}

func (w *wakeups) add(key types.NamespacedName) {
	if w.delay > 0 {
		w.queue.AddAfter(ctrl.Request{NamespacedName: key}, w.delay)
		return
	}
	w.queue.Add(ctrl.Request{NamespacedName: key})
}
