package execution

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/index"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

type queue = workqueue.TypedRateLimitingInterface[ctrl.Request]

// SetupWithManager registers the reconciler. Every watch event also feeds the
// dispatcher, which wakes the Executions it gives a pod to; the runner wakes
// an Execution whose run ended; a pod claimed by an Execution wakes it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.Execution{}).
		WatchesRawSource(r.Wakeups).
		Watches(&sandboxv1alpha1.Execution{}, r.executionEvents()).
		Watches(&corev1.Pod{}, r.podEvents()).
		Watches(&sandboxv1alpha1.SandboxPool{}, r.poolEvents()).
		Watches(&sandboxv1alpha1.Session{}, handler.EnqueueRequestsFromMapFunc(r.sessionExecutions)).
		// A reconcile waits on a few writes in a row (the claim, Running, the
		// final status), not on CPU: with 8 workers and writes of 50 ms on a
		// busy API server, Executions ran at 23/s (docs/scale.md).
		WithOptions(controller.Options{MaxConcurrentReconciles: executionWorkers}).
		Named("execution").
		Complete(r)
}

// executionWorkers is how many Executions are reconciled at once.
const executionWorkers = 32

// sessionExecutions wakes the unfinished Executions of a Session whose phase
// changed: they start once it is Ready and fail once it ended.
func (r *Reconciler) sessionExecutions(ctx context.Context, o client.Object) []ctrl.Request {
	ses, ok := o.(*sandboxv1alpha1.Session)
	if !ok {
		return nil
	}
	var list sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &list, client.InNamespace(ses.Namespace),
		client.MatchingFields{index.ActiveSession: index.SessionKey(ses.Spec.PoolRef.String(), ses.Name)}); err != nil {
		return nil
	}
	out := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

func (r *Reconciler) executionEvents() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ wakeup.Queue) {
			r.Dispatcher.UpdateExecution(e.Object.(*sandboxv1alpha1.Execution))
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ wakeup.Queue) {
			r.Dispatcher.UpdateExecution(e.ObjectNew.(*sandboxv1alpha1.Execution))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ wakeup.Queue) {
			r.Dispatcher.DeleteExecution(e.Object.GetUID())
		},
	}
}

func (r *Reconciler) podEvents() handler.EventHandler {
	// A claimed pod that changes (ends, is deleted, is released) wakes its Execution.
	wakeClaimer := func(pod *corev1.Pod, q wakeup.Queue) {
		if name := pod.Annotations[sandboxpod.AnnotationClaimedBy]; name != "" {
			// The Execution is in the namespace whose code the pod runs (a shared pool's pods are elsewhere).
			q.Add(ctrl.Request{NamespacedName: types.NamespacedName{Namespace: lease.Tenant(pod), Name: name}})
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q wakeup.Queue) {
			pod := e.Object.(*corev1.Pod)
			r.Dispatcher.UpdatePod(pod)
			wakeClaimer(pod, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q wakeup.Queue) {
			pod := e.ObjectNew.(*corev1.Pod)
			r.Dispatcher.UpdatePod(pod)
			wakeClaimer(pod, q)
			wakeClaimer(e.ObjectOld.(*corev1.Pod), q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q wakeup.Queue) {
			pod, ok := e.Object.(*corev1.Pod)
			if !ok {
				return
			}
			r.Dispatcher.DeletePod(pod)
			wakeClaimer(pod, q)
		},
	}
}

// poolEvents keeps the dispatcher's idea of each pool's template, and wakes a
// pool's waiting Executions when what they report changes: the pool appears
// or goes, or its Ready, Degraded or ScalingLimited condition changes (rare:
// the statuses of waiting Executions echo those).
func (r *Reconciler) poolEvents() handler.EventHandler {
	wakeWaiting := func(pool *sandboxv1alpha1.SandboxPool) {
		for _, key := range r.Dispatcher.WaitingOf(client.ObjectKeyFromObject(pool)) {
			r.Wakeups.Wake(key)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ wakeup.Queue) {
			pool := e.Object.(*sandboxv1alpha1.SandboxPool)
			r.Dispatcher.UpdatePool(pool)
			wakeWaiting(pool)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ wakeup.Queue) {
			old, pool := e.ObjectOld.(*sandboxv1alpha1.SandboxPool), e.ObjectNew.(*sandboxv1alpha1.SandboxPool)
			r.Dispatcher.UpdatePool(pool)
			if conditionChanged(old, pool, sandboxv1alpha1.PoolConditionReady, false) ||
				conditionChanged(old, pool, sandboxv1alpha1.PoolConditionDegraded, true) ||
				conditionChanged(old, pool, sandboxv1alpha1.PoolConditionScalingLimited, false) {
				wakeWaiting(pool)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ wakeup.Queue) {
			pool, ok := e.Object.(*sandboxv1alpha1.SandboxPool)
			if !ok {
				return
			}
			r.Dispatcher.DeletePool(client.ObjectKeyFromObject(pool))
			wakeWaiting(pool)
		},
	}
}

// conditionChanged compares a pool condition's status and reason (and
// message, when asked: Ready's counts pods and changes all the time).
func conditionChanged(old, cur *sandboxv1alpha1.SandboxPool, t string, message bool) bool {
	a, b := meta.FindStatusCondition(old.Status.Conditions, t), meta.FindStatusCondition(cur.Status.Conditions, t)
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return a.Status != b.Status || a.Reason != b.Reason || (message && a.Message != b.Message)
}
