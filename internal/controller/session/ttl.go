package session

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/ttl"
	"github.com/warmpool/warmpool/internal/lease"
)

// sessionTTLOf returns how long ses is kept after it ended (package ttl):
// its own ttlSecondsAfterFinished, else its pool's sessionTTLSecondsAfterFinished.
func (r *Reconciler) sessionTTLOf(ctx context.Context, ses *sandboxv1alpha1.Session) time.Duration {
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		return ttl.Of(ses.Spec.TTLSecondsAfterFinished, nil)
	}
	return ttl.Of(ses.Spec.TTLSecondsAfterFinished, pool.Spec.SessionTTLSecondsAfterFinished)
}

// endedAt is when ses ended: status.endTime, or for a Session that ended
// before that field existed, when its Ready condition last changed.
func endedAt(ses *sandboxv1alpha1.Session) time.Time {
	if ses.Status.EndTime != nil {
		return ses.Status.EndTime.Time
	}
	if c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil {
		return c.LastTransitionTime.Time
	}
	return ses.CreationTimestamp.Time
}

// finished frees an ended Session's pod while one may still be held, and
// deletes the Session once its TTL has passed. After lease.OrphanSessionPodGrace
// a pod still labelled with it is the pool's to delete (an orphan), so an
// old ended Session costs no pod list per reconcile.
func (r *Reconciler) finished(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	if err := r.dropSnapshots(ctx, ses); err != nil {
		return ctrl.Result{}, err
	}
	ended, now := endedAt(ses), r.Clock.Now()
	left := ttl.Left(ended, r.sessionTTLOf(ctx, ses), now)
	if left <= 0 {
		logf.FromContext(ctx).V(1).Info("deleting ended session after its TTL")
		return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, ses, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: &ses.UID}))
	}
	if now.Sub(ended) > lease.OrphanSessionPodGrace {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	res, err := r.free(ctx, ses)
	if err != nil || (res.RequeueAfter > 0 && res.RequeueAfter < left) {
		return res, err
	}
	return ctrl.Result{RequeueAfter: left}, nil
}
