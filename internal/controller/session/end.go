package session

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/recycle"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
)

// end stores a final phase, then frees the pod: the status is the commit point.
func (r *Reconciler) end(ctx context.Context, ses *sandboxv1alpha1.Session, phase sandboxv1alpha1.SessionPhase, reason, msg string) (ctrl.Result, error) {
	r.stopCheckpoints(client.ObjectKeyFromObject(ses))
	ses.Status.Phase = phase
	now := metav1.NewTime(r.Clock.Now())
	ses.Status.EndTime = &now
	ses.Status.Snapshot = nil // deleted from the store with the finalizer (finished)
	r.setReady(ses, metav1.ConditionFalse, reason, msg)
	if err := r.Status().Update(ctx, ses); err != nil {
		return ctrl.Result{}, fmt.Errorf("store %s status of session %s: %w", phase, ses.Name, err)
	}
	r.mu.Lock()
	delete(r.statusWritten, ses.UID)
	delete(r.suspendFailed, ses.UID)
	delete(r.moveBegun, ses.UID) // a move it did not finish
	r.mu.Unlock()
	r.Dispatcher.UpdateSession(ses)
	evType := corev1.EventTypeNormal
	if phase == sandboxv1alpha1.SessionLost {
		evType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(ses, nil, evType, reason, string(phase), "Session %s: %s", phase, msg)
	metrics.SessionsEnded.WithLabelValues(string(phase), reason).Inc()
	return r.free(ctx, ses)
}

// free gives an ended Session's pod back to its pool, deleted or reset per
// the pool's reusePolicy. A pod an Execution of the Session still runs on is
// left to that Execution's own timeout, then freed.
func (r *Reconciler) free(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	pod, err := r.labelledPod(ctx, ses)
	if err != nil || pod == nil {
		return ctrl.Result{}, err
	}
	if lease.ClaimedBy(pod) != "" {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	reuse := r.Get(ctx, ses.PoolKey(), pool) == nil &&
		pool.Spec.ReusePolicy == sandboxv1alpha1.ReuseFreshInterpreter &&
		(ses.Status.Phase == sandboxv1alpha1.SessionClosed || ses.Status.Phase == sandboxv1alpha1.SessionSuspended)
	// An Execution of the Session that was given the pod just before the
	// Session ended may claim it meanwhile: look again when it is done.
	held := false
	if reuse {
		released := false
		if err := recycle.RetryPodUpdate(ctx, r.APIReader, pod, func(p *corev1.Pod) error {
			held = lease.ClaimedBy(p) != ""
			err := lease.ReleaseSessionForReset(ctx, r.Client, p, ses, r.Clock.Now())
			released = err == nil && lease.Session(p) == ""
			return err
		}); err != nil {
			return ctrl.Result{}, err
		}
		if released {
			go recycle.Pod(logf.FromContext(ctx).WithValues("pod", pod.Name), r.Client, r.APIReader, r.Gate,
				client.ObjectKeyFromObject(pod), pod.UID)
		}
	} else {
		err = recycle.RetryPodUpdate(ctx, r.APIReader, pod, func(p *corev1.Pod) error {
			if held = lease.ClaimedBy(p) != ""; !lease.HeldBy(p, ses) || held {
				return nil
			}
			err := r.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete pod %s of session %s: %w", p.Name, ses.Name, err)
			}
			return nil
		})
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	if held {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, nil
}
