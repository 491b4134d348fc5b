package session

// The move policy. A Ready Session whose node is being drained (cordoned,
// or tainted by a tool that removes nodes: nodes.Drains) does not hold the
// drain until it ends: once its running step finishes (bounded by its
// timeout), its state is saved as a suspend saves it, its old pod deleted,
// and it resumes at once on a pod of another node, under the same name
// (the dispatcher hands out no pod on a drained node). A run sent meanwhile
// waits for it, as for a resume. status.lastMove says from where, to
// where, and how long it paused.
//
// A Session that cannot move (its state over the snapshot limit, no
// snapshot store) stays: its Movable condition and an Event say why, and
// the drain waits for it as before (the pool's PodDisruptionBudget keeps
// busy pods from eviction). Meanwhile it is looked after as any Ready
// Session: its idle timeout still ends it, and with it the drain's wait.

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/metrics"
)

// moveBusyRetry is how soon a Session whose run is under way on a drained
// node is looked at again: the run ends by its timeout, and the Session
// moves right after.
const moveBusyRetry = time.Second

// move takes a Ready Session off its drained node (why says how it is drained).
func (r *Reconciler) move(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, last *metav1.Time, runs int64, busy bool, why string) (ctrl.Result, error) {
	if busy {
		return ctrl.Result{RequeueAfter: moveBusyRetry}, nil
	}
	return r.suspend(ctx, ses, pod, last, runs, why)
}

// mayMove reports whether a move is to be tried now: with a snapshot store,
// and not within suspendRetry of one that failed (meanwhile the Session is
// looked after as any Ready Session, its idle timeout included).
func (r *Reconciler) mayMove(ses *sandboxv1alpha1.Session, now time.Time) bool {
	if r.Snapshots == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	retry, failed := r.suspendFailed[ses.UID]
	return !failed || !retry.After(now)
}

// cannotMove records why a Session on a drained node stays, after its
// suspend failed (err), and looks again after suspendRetry: a Session whose
// state shrank moves then.
func (r *Reconciler) cannotMove(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, why string, err error) (ctrl.Result, error) {
	if err := r.unmovable(ctx, ses, pod, why, err); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: suspendRetry}, nil
}

// unmovable writes the Movable=False condition of a Session on a drained
// node, when it changes, with a Warning Event: err is its suspend's
// failure; nil: there is no snapshot store.
func (r *Reconciler) unmovable(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, why string, err error) error {
	reason, msg := sandboxv1alpha1.ReasonNoSnapshotStore, fmt.Sprintf(
		"%s, and the Session stays on pod %s: the manager has no snapshot store to move its state through; the drain waits until it ends", why, pod.Name)
	switch {
	case agentgate.IsStatus(err, http.StatusRequestEntityTooLarge):
		reason, msg = sandboxv1alpha1.ReasonTooLargeToMove, fmt.Sprintf(
			"%s, and the Session stays on pod %s: its state is over the snapshot limit (%v); the drain waits until it ends or its state shrinks", why, pod.Name, err)
	case err != nil:
		reason, msg = sandboxv1alpha1.ReasonSuspendFailed, fmt.Sprintf(
			"%s, and the Session stays on pod %s for now: its state could not be saved (%v); trying again in %s", why, pod.Name, err, suspendRetry)
	}
	c := metav1.Condition{Type: sandboxv1alpha1.SessionConditionMovable, Status: metav1.ConditionFalse, Reason: reason, Message: msg,
		ObservedGeneration: ses.Generation}
	if old := meta.FindStatusCondition(ses.Status.Conditions, c.Type); old != nil && old.Reason == c.Reason && old.Message == c.Message {
		return nil
	}
	meta.SetStatusCondition(&ses.Status.Conditions, c)
	if err := r.Status().Update(ctx, ses); err != nil {
		return fmt.Errorf("store the Movable condition of session %s: %w", ses.Name, err)
	}
	r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, reason, "Move", "%s", msg)
	return nil
}

// moved completes a move in the Ready status about to be stored on pod.
// Its pause counts from when this process began it: startTime, as stored,
// keeps whole seconds (a manager that restarted in between counts from it).
func (r *Reconciler) moved(ses *sandboxv1alpha1.Session, mv *sandboxv1alpha1.SessionMove, pod *corev1.Pod, now metav1.Time) {
	mv.ToNode, mv.EndTime = pod.Spec.NodeName, &now
	begun := mv.StartTime.Time
	r.mu.Lock()
	if t, ok := r.moveBegun[ses.UID]; ok && !t.Before(begun) {
		begun = t
	}
	delete(r.moveBegun, ses.UID)
	r.mu.Unlock()
	pause := now.Sub(begun)
	mv.PauseMillis = pause.Milliseconds()
	ses.Status.Moves++
	metrics.SessionMovePause.Observe(pause.Seconds())
}
