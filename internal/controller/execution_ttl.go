package controller

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// The TTL policy: a finished Execution is deleted ttlSecondsAfterFinished
// after it finished: its own, else its pool's executionDefaults, else
// defaultTTL. Finished Executions would otherwise pile up in etcd (up to
// ~700 KiB each with full output) for as long as the cluster lives.
const defaultTTL = time.Hour

// ttlOf returns how long ex is kept after it finished.
func (r *ExecutionReconciler) ttlOf(ctx context.Context, ex *sandboxv1alpha1.Execution) time.Duration {
	if t := ex.Spec.TTLSecondsAfterFinished; t != nil {
		return time.Duration(*t) * time.Second
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Spec.PoolRef.Name}, pool); err == nil {
		if t := pool.Spec.ExecutionDefaults.TTLSecondsAfterFinished; t != nil {
			return time.Duration(*t) * time.Second
		}
	}
	return defaultTTL
}

// applyTTL deletes ex once its TTL has passed, or asks to be woken then.
func (r *ExecutionReconciler) applyTTL(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, error) {
	if ex.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	expire := ex.Status.CompletionTime.Add(r.ttlOf(ctx, ex))
	if left := expire.Sub(r.now()); left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	logf.FromContext(ctx).V(1).Info("deleting finished execution after its TTL")
	return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, ex, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &ex.UID}))
}
