package controller

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// The TTL policy of Sessions: an ended Session is deleted
// ttlSecondsAfterFinished after it ended: its own, else its pool's
// sessionTTLSecondsAfterFinished, else defaultTTL. Ended Sessions would
// otherwise pile up for as long as the cluster lives.

// sessionTTLOf returns how long ses is kept after it ended.
func (r *SessionReconciler) sessionTTLOf(ctx context.Context, ses *sandboxv1alpha1.Session) time.Duration {
	if t := ses.Spec.TTLSecondsAfterFinished; t != nil {
		return time.Duration(*t) * time.Second
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ses.Namespace, Name: ses.Spec.PoolRef.Name}, pool); err == nil {
		if t := pool.Spec.SessionTTLSecondsAfterFinished; t != nil {
			return time.Duration(*t) * time.Second
		}
	}
	return defaultTTL
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
// deletes the Session once its TTL has passed. After orphanSessionPodGrace
// a pod still labelled with it is the pool's to delete (an orphan), so an
// old ended Session costs no pod list per reconcile.
func (r *SessionReconciler) finished(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	ended := endedAt(ses)
	expire := ended.Add(r.sessionTTLOf(ctx, ses))
	now := r.Clock.Now()
	if !now.Before(expire) {
		logf.FromContext(ctx).V(1).Info("deleting ended session after its TTL")
		return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, ses, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: &ses.UID}))
	}
	ttl := ctrl.Result{RequeueAfter: expire.Sub(now)}
	if now.Sub(ended) > orphanSessionPodGrace {
		return ttl, nil
	}
	res, err := r.free(ctx, ses)
	if err != nil || (res.RequeueAfter > 0 && res.RequeueAfter < ttl.RequeueAfter) {
		return res, err
	}
	return ttl, nil
}
