package execution

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The timeout policy, on the manager's side (the agent enforces the timeout
// itself too, so code stops even while the manager is away):
//   - the runner interrupts at the deadline and gives up at deadline + grace + Slack;
//   - a manager that did not start the run (it restarted) asks the agent what
//     became of it before deciding anything, and gives it grace + Slack to answer;
//   - whatever happens to the runner, the reconciler ends a run that is still
//     not over lateBy after both of those (ownDeadline): no Execution stays
//     Running forever.
const lateBy = 2 * runner.Slack

// ownDeadline is when the reconciler stops waiting for the runner.
func (r *Reconciler) ownDeadline(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool) time.Time {
	since, _ := r.Runner.Since(ex.UID)
	return reconcilerDeadline(ex.Status.StartTime.Time, since, timeoutOf(ex, pool), graceOf(pool))
}

// reconcilerDeadline: the run's own end (start + timeout + grace + slack), or,
// for a run this manager took over late (since: when it started or
// re-attached; zero if it has not), the grace and slack counted from then;
// plus lateBy.
func reconcilerDeadline(start, since time.Time, timeout, grace time.Duration) time.Time {
	end := start.Add(timeout + grace + runner.Slack + lateBy)
	if attached := since.Add(grace + runner.Slack + lateBy); !since.IsZero() && attached.After(end) {
		end = attached
	}
	return end
}

func (r *Reconciler) reconcileRunning(ctx context.Context, ex *sandboxv1alpha1.Execution, next *afterWrite) (ctrl.Result, error) {
	pool := &sandboxv1alpha1.SandboxPool{}
	poolErr := r.Get(ctx, ex.PoolKey(), pool)
	if poolErr != nil && !apierrors.IsNotFound(poolErr) {
		return ctrl.Result{}, poolErr
	}
	pod, replaced, err := r.runningPod(ctx, ex)
	if err != nil {
		return ctrl.Result{}, err
	}
	ours := pod != nil && lease.ClaimedBy(pod) == ex.UID
	if o, ok := r.Runner.Outcome(ex.UID); ok {
		// A run given up on a lost node whose pod could not be deleted
		// then (neverReached returned the error): its outcome is only that.
		if lost := r.lostNode(pod); lost != "" && ours && ex.Spec.Session == "" && !r.Runner.Abandon(ex.UID, abandonWait) {
			return r.neverReached(ctx, ex, pod, lost)
		}
		if errors.Is(o.Err, runner.ErrNotStarted) {
			return r.notStarted(ctx, ex, pool, pod, next)
		}
		if wait := waitForPodEnd(ex, pool, pod, o); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		r.finish(ex, pool, pod, o)
		return ctrl.Result{}, nil
	}
	if pod != nil && !ours && !r.Runner.Tracked(ex.UID) {
		// Running on a pod it does not hold: either the pod cache lags behind
		// the claim, or the claim, written with the Running status, failed and
		// the manager stopped before it took Running back. Code is sent only
		// once both are stored, so in the second case it never ran.
		live := &corev1.Pod{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), live); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("read pod %s: %w", pod.Name, err)
		} else if err == nil && live.UID == pod.UID && lease.ClaimedBy(live) != ex.UID {
			// Even on a pod being deleted: a claim is taken off only after
			// the final status, so one never seen never committed.
			logf.FromContext(ctx).Info("running on a pod it never claimed: back in the queue", "pod", pod.Name)
			r.unclaimed(ex, fmt.Sprintf("its claim of pod %s did not commit: back in the queue", pod.Name))
			r.Dispatcher.UpdatePod(live)
			return ctrl.Result{}, nil
		} else if err == nil && lease.ClaimedBy(live) == ex.UID {
			pod, ours = live, true
		}
	}
	if !ours || sandboxpod.IsTerminal(pod) || poolErr != nil {
		r.Runner.Cancel(ex.UID)
		reason, msg := sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("pod %s was deleted or stopped while the code ran", ex.Status.PodName)
		if replaced {
			msg += " (a pod now under its name is another one: nothing is asked of it, nor done to it)"
		}
		if pod != nil && pod.Status.Message != "" {
			msg += ": " + pod.Status.Message
		}
		if why, whyMsg := podstatus.End(pod); why != "" {
			reason, msg = why, whyMsg
		}
		ex.Status.Stdout, ex.Status.Stderr = r.Runner.Partial(ex.UID)
		r.fail(ex, reason, msg, deleteIfOurs(ours))
		return ctrl.Result{}, nil
	}
	if key := pod.Labels[sandboxpod.LabelAgentKey]; !r.Keys.Has(key) {
		r.Runner.Cancel(ex.UID)
		r.fail(ex, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("the manager cannot reach pod %s any more: its agent key %q was "+
			"removed from the agent keys Secret while the code ran", pod.Name, key), sandboxv1alpha1.DispositionDelete)
		return ctrl.Result{}, nil
	}
	if lost := r.lostNode(pod); lost != "" {
		// A run of no Session whose code this manager alone sent, and never
		// wrote to the pod, cannot run there, ever: it runs on another pod.
		if ex.Spec.Session == "" && !r.Runner.Abandon(ex.UID, abandonWait) {
			return r.neverReached(ctx, ex, pod, lost)
		}
		// The agent can neither be asked how the run ended nor stopped. The
		// code may have run, in part or whole: it is not run again.
		r.Runner.Cancel(ex.UID)
		ex.Status.Stdout, ex.Status.Stderr = r.Runner.Partial(ex.UID)
		r.fail(ex, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("%s while the code ran on pod %s: it may have run in part or whole, "+
			"and is not run again (its output so far is kept)", lost, pod.Name), sandboxv1alpha1.DispositionDelete)
		return ctrl.Result{}, nil
	}
	if !r.Runner.Tracked(ex.UID) {
		// A restarted manager: ask the agent what became of the run, by the
		// Execution's UID. The code is not sent again.
		if res, done := r.reattach(ctx, ex, pool, pod); done {
			return res, nil
		}
	}
	if ex.Spec.Cancel {
		r.Runner.Cancel(ex.UID)
	}
	deadline := r.ownDeadline(ex, pool)
	if left := deadline.Sub(r.now()); left > 0 {
		// The runner wakes this Execution when the run ends; this is the backstop.
		return ctrl.Result{RequeueAfter: max(left, time.Second)}, nil
	}
	// Not forgotten yet: the runner remembers a run until the cache shows its
	// final status (reconcileFinished), the guard against a reconcile from a
	// lagging view claiming another pod for it.
	r.Runner.Cancel(ex.UID)
	msg := fmt.Sprintf("no outcome from the sandbox agent by %s, well after the timeout of %s and the grace period of %s; the pod is deleted",
		deadline.UTC().Format(time.RFC3339), timeoutOf(ex, pool), graceOf(pool))
	r.end(ex, sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut, msg,
		&sandboxv1alpha1.ExecutionError{Type: sandboxv1alpha1.ReasonTimedOut, Message: msg}, sandboxv1alpha1.DispositionDelete)
	return ctrl.Result{}, nil
}

// lostNode says why pod's node is given up for lost ("" when it is not, or there is no pod).
func (r *Reconciler) lostNode(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	return r.Nodes.Lost(pod.Spec.NodeName)
}

// abandonWait bounds how long a reconcile waits for a run on a lost node to
// let go of its connection (Runner.Abandon): it is cut at once, so this
// is only reached by a send stuck past its context.
const abandonWait = 5 * time.Second

// neverReached puts an Execution whose code never reached its pod back in
// the queue: the pod's node stopped answering, and the request that carries
// the code was never written to it (not a byte: Runner.Abandon), so the code
// cannot run there, now or when the node comes back. The pod is deleted
// first: a claimed pod is what a restarted manager sends the code to again
// (reconcilePending), and a manager that stops after the delete and before
// the Pending status finds the run's pod gone and reports the run lost, the
// safe answer. The reconciler remembers the pod until the cache shows the
// delete, so a lagging view never resumes the run on it.
func (r *Reconciler) neverReached(ctx context.Context, ex *sandboxv1alpha1.Execution, pod *corev1.Pod, lost string) (ctrl.Result, error) {
	if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return ctrl.Result{}, fmt.Errorf("delete pod %s on a lost node: %w", pod.Name, err)
	}
	r.abandoned.Store(ex.UID, pod.UID)
	r.Runner.Forget(ex.UID)
	msg := fmt.Sprintf("%s before its code reached pod %s (nothing was sent to it): back in the queue, for a pod on another node", lost, pod.Name)
	logf.FromContext(ctx).Info("the run never reached a pod on a lost node: back in the queue", "pod", pod.Name, "node", pod.Spec.NodeName)
	r.Recorder.Eventf(ex, pod, corev1.EventTypeWarning, sandboxv1alpha1.ReasonRequeued, "Requeue", "%s", msg)
	r.unclaimed(ex, msg)
	return ctrl.Result{}, nil
}

// unreachable handles a pod the manager cannot address (no IP yet after a
// restart, say): wait until the reconciler's own deadline, then give up.
func (r *Reconciler) unreachable(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, err error) (ctrl.Result, error) {
	if left := r.ownDeadline(ex, pool).Sub(r.now()); left > 0 {
		return ctrl.Result{RequeueAfter: min(left, 5*time.Second)}, nil
	}
	r.fail(ex, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("cannot reach pod %s: %v", ex.Status.PodName, err), sandboxv1alpha1.DispositionDelete)
	return ctrl.Result{}, nil
}

// notStarted judges a run the agent does not know, found on re-attach: the
// request never reached the agent (the manager stopped between storing
// Running and sending it), or the agent restarted and lost it. The code runs
// now, with its timeout counted from now, only if nothing can have run yet
// and it is the very code that was to start.
func (r *Reconciler) notStarted(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, next *afterWrite) (ctrl.Result, error) {
	if pod != nil && lease.ClaimedBy(pod) != ex.UID {
		// The look that re-attached may have read the claim around a cache
		// that lagged (reconcileRunning), and the cache still lag: a claim
		// the cache does not show yet is not a pod that went away.
		live := &corev1.Pod{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), live); err == nil && live.UID == pod.UID {
			pod = live
		} else if err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("read pod %s: %w", pod.Name, err)
		}
	}
	r.Runner.Forget(ex.UID)
	if pod == nil || lease.ClaimedBy(pod) != ex.UID {
		r.fail(ex, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("pod %s was deleted or stopped while the code ran", ex.Status.PodName), "")
		return ctrl.Result{}, nil
	}
	if restarted(pod) {
		r.fail(ex, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf("the sandbox agent of pod %s restarted while the code ran: "+
			"the run and the interpreter's state are lost", pod.Name), sandboxv1alpha1.DispositionDelete)
		return ctrl.Result{}, nil
	}
	code, err := r.code(ctx, ex)
	if err != nil {
		r.codeFailed(ex, err)
		ex.Status.PodDisposition = unusedPodDisposition(ex)
		return ctrl.Result{}, nil
	}
	if ex.Status.CodeDigest != "" && digest(code) != ex.Status.CodeDigest {
		r.fail(ex, sandboxv1alpha1.ReasonCodeSourceChanged, fmt.Sprintf("the run never reached pod %s before the manager stopped, "+
			"and spec.codeFrom now holds other code (%s, not %s): other code is never run under this Execution's name; create a new one",
			pod.Name, digest(code), ex.Status.CodeDigest), unusedPodDisposition(ex))
		return ctrl.Result{}, nil
	}
	// Its timeout counts from now: the code has not run, and a failover that
	// outlasted the timeout is the operator's delay, not the code's.
	now := metav1.NewTime(r.now())
	ex.Status.StartTime = &now
	job := r.job(ex, pool, pod, now.Time)
	job.Request = r.request(ex, pool, code)
	if ex.Spec.Session != "" {
		job.Request.Interpreter = r.sessionInterpreter(ctx, ex, pod)
	}
	job.CodeDigest = digest(code)
	logf.FromContext(ctx).Info("the run never reached the agent; starting it now", "pod", pod.Name)
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionWaitingForSandbox,
		Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.ReasonSandboxClaimed,
		Message: "running on pod " + pod.Name + "; sent again after a manager restart (the first request never reached the agent)"})
	next.send, next.pool, next.pod = &job, pool, pod
	return ctrl.Result{}, nil
}

// reattach follows the run on the pod the gate opens for the Execution. A
// run started by a manager from before status.podUID existed records none:
// its pod is adopted, once, if the gate admits it as its claimed pod.
func (r *Reconciler) reattach(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (ctrl.Result, bool) {
	if ex.Status.PodUID == "" && r.Gate.Admit(pool, pod, agentgate.ForExecution(ex)) == nil {
		ex.Status.PodUID = pod.UID
	}
	agent, err := r.Gate.Open(ctx, pool, pod, agentgate.ForExecution(ex))
	if agentgate.IsRefused(err) {
		r.Runner.Cancel(ex.UID)
		r.Recorder.Eventf(ex, pod, corev1.EventTypeWarning, sandboxv1alpha1.ReasonSandboxRefused, "Attach", "pod %s: %v", pod.Name, err)
		r.fail(ex, sandboxv1alpha1.ReasonSandboxRefused, fmt.Sprintf("the run cannot be followed: %v; nothing was asked of that pod, "+
			"and nothing is done to it", err), "")
		return ctrl.Result{}, true
	}
	if err != nil {
		res, _ := r.unreachable(ex, pool, err)
		return res, true
	}
	job := r.job(ex, pool, pod, r.now())
	job.Agent = agent
	logf.FromContext(ctx).Info("re-attaching to a running execution", "pod", pod.Name)
	r.Runner.Attach(job)
	return ctrl.Result{}, false
}

// unusedPodDisposition is the fate of a claimed pod on which nothing ran: a
// session keeps it, any other goes (a claimed pod never returns to the pool
// unreset).
func unusedPodDisposition(ex *sandboxv1alpha1.Execution) sandboxv1alpha1.PodDisposition {
	if ex.Spec.Session != "" {
		return sandboxv1alpha1.DispositionReleaseToSession
	}
	return sandboxv1alpha1.DispositionDelete
}

func restarted(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.RestartCount > 0 {
			return true
		}
	}
	return false
}

func deleteIfOurs(ours bool) sandboxv1alpha1.PodDisposition {
	if ours {
		return sandboxv1alpha1.DispositionDelete
	}
	return "" // not ours (any more): never touch it
}

// runningPod returns the pod of a running Execution, read around the cache
// when the cache does not show it claimed by ex: the pod informer can lag
// behind the Execution informer (a run can end before the claim is in the cache).
func (r *Reconciler) runningPod(ctx context.Context, ex *sandboxv1alpha1.Execution) (pod *corev1.Pod, replaced bool, err error) {
	key := ex.PodKey()
	pod = &corev1.Pod{}
	err = r.Get(ctx, key, pod)
	if err == nil && !sandboxpod.IsTerminal(pod) && lease.ClaimedBy(pod) == ex.UID && samePod(ex, pod) {
		return pod, false, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	live := &corev1.Pod{}
	switch err := r.APIReader.Get(ctx, key, live); {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case !samePod(ex, live):
		return nil, true, nil // gone: the pod under its name now is another one
	}
	return live, false, nil
}

// samePod reports whether pod is the one the Execution recorded (any, for
// an Execution started before status.podUID existed).
func samePod(ex *sandboxv1alpha1.Execution, pod *corev1.Pod) bool {
	return ex.Status.PodUID == "" || pod.UID == ex.Status.PodUID
}
