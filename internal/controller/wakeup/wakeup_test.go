package wakeup

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// A wake-up goes ahead of the informers' requests already queued: the
// Execution whose pod was chosen runs before a burst's others say they wait.
func TestWakeUpsGoAheadOfQueuedEvents(t *testing.T) {
	q := priorityqueue.New[ctrl.Request]("test")
	defer q.ShutDown()
	for _, name := range []string{"burst-1", "burst-2", "burst-3"} {
		q.Add(ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "big", Name: name}})
	}
	w := &Source{Priority: High}
	if err := w.Start(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	w.Wake(types.NamespacedName{Namespace: "small", Name: "ready"})
	got, _ := q.Get()
	if got.Name != "ready" {
		t.Errorf("first out %s, want the woken one", got)
	}
	plain := &Source{}
	q2 := priorityqueue.New[ctrl.Request]("test2")
	defer q2.ShutDown()
	q2.Add(ctrl.Request{NamespacedName: types.NamespacedName{Name: "first"}})
	if err := plain.Start(context.Background(), q2); err != nil {
		t.Fatal(err)
	}
	plain.Wake(types.NamespacedName{Name: "second"})
	if got, _ := q2.Get(); got.Name != "first" {
		t.Errorf("without a priority: first out %s, want the one queued first", got)
	}
}
