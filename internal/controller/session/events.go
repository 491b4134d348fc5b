package session

import (
	"context"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// sessionWorkers is how many Sessions are reconciled at once.
const sessionWorkers = 16

// SetupWithManager registers the reconciler. Session events feed the
// dispatcher; the dispatcher wakes a Session it chose a pod for; a change of
// a Session's pod wakes the Session (lost, released by an Execution).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	// The checkpoint loops run while the manager leads, as the reconciler does.
	if err := mgr.Add(r.checkpoints); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.Session{}, builder.WithPredicates(needsALook())).
		WatchesRawSource(r.Wakeups).
		Watches(&sandboxv1alpha1.Session{}, r.sessionEvents()).
		Watches(&corev1.Pod{}, sessionPodEvents()).
		// A namespace's labels decide its admission to shared pools: a
		// change wakes its Sessions (check ends those no longer admitted).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.sessionsOfNamespace)).
		// Leases and checks call agents (up to 5 s for a health check): a few
		// slow sandboxes must not hold up every other Session. A lease waits
		// on two writes and an agent, not on CPU: at 75 new Sessions a second
		// four workers queued them for seconds (docs/scale.md).
		WithOptions(controller.Options{MaxConcurrentReconciles: sessionWorkers}).
		Named("session").
		Complete(r)
}

// needsALook lets through every change of a Session but the ones its own
// reconcile made to a Ready Session's status: the Ready of its lease, its
// activity, the data plane's record of a new interpreter. That reconcile
// already set when it looks next, and a look now would ask the agent for its
// health again; at 75 new Sessions a second these looks took the workers the
// next leases waited for (docs/scale.md). Spec, metadata (close, resume, the
// finalizer, deletion) and phase changes still wake it.
func needsALook() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*sandboxv1alpha1.Session)
		cur, okCur := e.ObjectNew.(*sandboxv1alpha1.Session)
		if !okOld || !okCur {
			return true
		}
		statusOnly := old.Generation == cur.Generation && cur.DeletionTimestamp == nil &&
			maps.Equal(old.Annotations, cur.Annotations) && maps.Equal(old.Labels, cur.Labels) &&
			slices.Equal(old.Finalizers, cur.Finalizers)
		return !statusOnly || cur.Status.Phase != sandboxv1alpha1.SessionReady ||
			old.Status.PodName != "" && old.Status.PodName != cur.Status.PodName
	}}
}

// sessionPodEvents wakes a Session when its pod changes in a way it must act
// on: the pod went away, stopped, changed readiness or lost the Session's
// label. The claims and releases of the Session's Executions do not: they
// come with every run, and the idle timeout reads their last one when it is
// due.
func sessionPodEvents() handler.TypedEventHandler[client.Object, ctrl.Request] {
	enqueue := func(pod client.Object, q wakeup.Queue) {
		if p, ok := pod.(*corev1.Pod); ok && lease.Session(p) != "" {
			// The Session is in the namespace whose code the pod runs (a shared pool's pods are elsewhere).
			q.Add(ctrl.Request{NamespacedName: types.NamespacedName{Namespace: lease.Tenant(p), Name: lease.Session(p)}})
		}
	}
	return handler.Funcs{
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q wakeup.Queue) {
			old, cur, ok := podPair(e)
			if !ok {
				return
			}
			switch {
			case lease.Session(old) != lease.Session(cur):
				// The Session that lost the pod must know. The one that gained it
				// claimed it itself and writes its status next: a reconcile now
				// would read it from a cache that has not seen that status yet
				// and lease again.
				enqueue(old, q)
			case cur.DeletionTimestamp != nil || sandboxpod.IsTerminal(cur) || sandboxpod.IsReady(old) != sandboxpod.IsReady(cur):
				enqueue(cur, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q wakeup.Queue) { enqueue(e.Object, q) },
	}
}

func podPair(e event.UpdateEvent) (old, cur *corev1.Pod, ok bool) {
	old, ok1 := e.ObjectOld.(*corev1.Pod)
	cur, ok2 := e.ObjectNew.(*corev1.Pod)
	return old, cur, ok1 && ok2
}

// sessionEvents feeds the dispatcher and enqueues nothing (For does).
func (r *Reconciler) sessionEvents() handler.TypedEventHandler[client.Object, ctrl.Request] {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ wakeup.Queue) {
			ses := e.Object.(*sandboxv1alpha1.Session)
			r.Dispatcher.UpdateSession(ses)
			if ses.Status.Phase == "" && ses.DeletionTimestamp == nil {
				r.mu.Lock()
				r.seen[ses.UID] = time.Now() // a measurement (metrics.SessionReady), not a decision
				r.mu.Unlock()
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ wakeup.Queue) {
			r.Dispatcher.UpdateSession(e.ObjectNew.(*sandboxv1alpha1.Session))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ wakeup.Queue) {
			if ses, ok := e.Object.(*sandboxv1alpha1.Session); ok {
				r.Dispatcher.DeleteSession(ses)
				r.mu.Lock()
				delete(r.statusWritten, ses.UID) // a Session deleted while Ready
				delete(r.seen, ses.UID)
				delete(r.suspendFailed, ses.UID)
				r.mu.Unlock()
			}
		},
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sessionsOfNamespace lists the Sessions of a namespace that use another
// namespace's (a shared) pool.
func (r *Reconciler) sessionsOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var list sandboxv1alpha1.SessionList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetName())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if ses := &list.Items[i]; ses.PoolKey().Namespace != ses.Namespace && !ses.Status.Phase.IsFinished() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ses)})
		}
	}
	return out
}
