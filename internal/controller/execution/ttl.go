package execution

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/ttl"
)

// ttlOf returns how long ex is kept after it finished (package ttl): its own
// ttlSecondsAfterFinished, else its pool's executionDefaults one.
func (r *Reconciler) ttlOf(ctx context.Context, ex *sandboxv1alpha1.Execution) time.Duration {
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ex.PoolKey(), pool); err != nil {
		return ttl.Of(ex.Spec.TTLSecondsAfterFinished, nil)
	}
	return ttl.Of(ex.Spec.TTLSecondsAfterFinished, pool.Spec.ExecutionDefaults.TTLSecondsAfterFinished)
}

// applyTTL deletes ex once its TTL has passed, or asks to be woken then.
func (r *Reconciler) applyTTL(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, error) {
	if ex.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	if left := ttl.Left(ex.Status.CompletionTime.Time, r.ttlOf(ctx, ex), r.now()); left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	logf.FromContext(ctx).V(1).Info("deleting finished execution after its TTL")
	return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, ex, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &ex.UID}))
}
