package pool

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// recordingQueue records how each request was added.
type recordingQueue struct {
	wakeup.Queue
	now   []types.NamespacedName
	after map[types.NamespacedName]time.Duration
}

func (q *recordingQueue) Add(r ctrl.Request) { q.now = append(q.now, r.NamespacedName) }
func (q *recordingQueue) AddAfter(r ctrl.Request, d time.Duration) {
	if q.after == nil {
		q.after = map[types.NamespacedName]time.Duration{}
	}
	q.after[r.NamespacedName] = d
}

func poolPod(name, pool, label string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		Labels: map[string]string{sandboxpod.LabelPool: label},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxPool",
			Name: pool, UID: "u", Controller: ptr.To(true)}}}}
}

func TestPodEventsWakeThePoolAtOnceOnCreateAndDeleteAndBatchUpdates(t *testing.T) {
	r := &Reconciler{expectations: newExpectations(time.Now)}
	h := r.podEvents()
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "py"}

	q := &recordingQueue{}
	h.Update(ctx, event.UpdateEvent{ObjectOld: poolPod("a", "py", "py"), ObjectNew: poolPod("a", "py", "py")}, q)
	if len(q.now) != 0 || q.after[key] != podUpdateBatch {
		t.Fatalf("an update: woke %v at once, %v later; want only %v later", q.now, q.after, podUpdateBatch)
	}

	q = &recordingQueue{}
	r.expectations.Created(key, "b")
	h.Create(ctx, event.CreateEvent{Object: poolPod("b", "py", "py")}, q)
	h.Delete(ctx, event.DeleteEvent{Object: poolPod("a", "py", "py")}, q)
	if len(q.now) != 2 || q.now[0] != key || q.now[1] != key || len(q.after) != 0 {
		t.Fatalf("a create and a delete: woke %v at once, %v later; want the pool twice at once", q.now, q.after)
	}
	if pending, _ := r.expectations.Observe(key, map[string]bool{}, time.Now()); pending != 0 {
		t.Fatalf("the created pod's event was not told to the expectations: %d creates pending", pending)
	}

	// A pod someone else labelled for the pool, or owned by something else.
	q = &recordingQueue{}
	r.expectations.Created(key, "c")
	h.Create(ctx, event.CreateEvent{Object: poolPod("c", "py", "other")}, q)
	if pending, _ := r.expectations.Observe(key, map[string]bool{}, time.Now()); pending != 1 {
		t.Fatalf("a pod under another pool's label was counted for py: %d creates pending, want 1", pending)
	}
	notOurs := poolPod("d", "py", "py")
	notOurs.OwnerReferences[0].APIVersion = "apps/v1"
	h.Create(ctx, event.CreateEvent{Object: notOurs}, q)
	h.Update(ctx, event.UpdateEvent{ObjectOld: notOurs, ObjectNew: notOurs}, q)
	if len(q.now) != 1 || len(q.after) != 0 {
		t.Fatalf("a pod of another API group woke the pool: %v at once, %v later", q.now, q.after)
	}
}
