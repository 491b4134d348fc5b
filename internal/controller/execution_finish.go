package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agent/protocol"
	"github.com/warmpool/warmpool/internal/claim"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// finish turns a run's outcome into the final status and decides the pod's
// fate: a session keeps its pod while the interpreter's state is intact; a
// pool that reuses pods gets it back with a fresh interpreter; otherwise (and
// whenever the code did not end cleanly) the pod is deleted and the pool
// replaces it.
//
// A pod to delete is deleted after the final status is written (the returned
// function), so the user does not wait for it: should the manager stop in
// between, the pool controller deletes pods claimed by finished Executions.
func (r *ExecutionReconciler) finish(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, o runner.Outcome) (afterStatus func(context.Context) error, err error) {
	clean := false
	switch {
	case o.Err != nil:
		var phase sandboxv1alpha1.ExecutionPhase
		var reason string
		switch {
		case o.Cancelled:
			phase, reason = sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled
		case errors.Is(o.Err, runner.ErrNoAnswer) && ex.Status.StartTime != nil &&
			time.Now().After(ex.Status.StartTime.Add(timeoutOf(ex, pool))):
			phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
		default:
			phase, reason = sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonSandboxLost
		}
		msg := o.Err.Error() + "; the pod was deleted"
		r.end(ex, phase, reason, msg, &sandboxv1alpha1.ExecutionError{Type: reason, Message: msg})
	default:
		res := o.Result
		r.copyResult(ex, res)
		var phase sandboxv1alpha1.ExecutionPhase
		reason, msg := "", ""
		switch res.Status {
		case protocol.StatusSucceeded:
			phase, reason, msg = sandboxv1alpha1.PhaseSucceeded, sandboxv1alpha1.ReasonSucceeded, "the code ran to its end"
		case protocol.StatusTimedOut:
			phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
			msg = fmt.Sprintf("interrupted (KeyboardInterrupt) at the timeout of %s", timeoutOf(ex, pool))
		case protocol.StatusInterrupted:
			// Only two parties interrupt: a cancel, and the runner at the deadline.
			phase, reason, msg = sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled, "interrupted on request"
			if !o.Cancelled {
				phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
				msg = fmt.Sprintf("interrupted (KeyboardInterrupt) at the timeout of %s", timeoutOf(ex, pool))
			}
		default:
			phase, reason, msg = sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonError, "the code failed"
			if res.Error != nil {
				msg = fmt.Sprintf("%s: %s", res.Error.Type, res.Error.Message)
				if res.Error.Type == protocol.ErrorInterpreterDied {
					reason = protocol.ErrorInterpreterDied
				}
			}
		}
		if res.StateLost {
			msg += "; the interpreter was killed or died, so the pod was deleted"
		}
		r.end(ex, phase, reason, msg, nil)
		clean = !res.StateLost
	}
	if pod == nil {
		return nil, nil
	}
	// Only the Execution that holds the pod decides its fate. reconcileRunning
	// read the pod live whenever the cache did not show it claimed by ex; a
	// cached copy that is stale (the pod was released already, or claimed by the
	// session's next Execution) fails the releases below on its resourceVersion,
	// and their retry re-reads the pod and finds it is not ex's any more. A pod
	// to delete was used up by ex whatever happened since: no read needed.
	if claim.ClaimedBy(pod) != ex.UID {
		return nil, nil
	}
	// A timeout always costs the pod unless a session keeps its (cleanly interrupted) interpreter.
	if ex.Status.Phase == sandboxv1alpha1.PhaseTimedOut && ex.Spec.Session == "" {
		clean = false
	}
	switch {
	case clean && ex.Spec.Session != "":
		return nil, r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error { return claim.ReleaseToSession(ctx, r.Client, p, ex, time.Now()) })
	case clean && pool.Spec.ReusePolicy == sandboxv1alpha1.ReuseFreshInterpreter:
		addr, err := r.Resolver.Address(pod)
		if err != nil {
			logf.FromContext(ctx).Info("cannot reach the agent to reset it for reuse; deleting the pod", "pod", pod.Name, "err", err.Error())
			return r.deleteAfterStatus(pod), nil
		}
		if err := r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error {
			return claim.ReleaseForReset(ctx, r.Client, p, ex, time.Now())
		}); err != nil {
			return nil, err
		}
		// A new interpreter takes about a second under gVisor: replace it off
		// the request path, so the Execution's result is written now.
		go r.reset(logf.FromContext(ctx).WithValues("pod", pod.Name), clientKey(pod), addr, pod.UID, pod.Labels[sandboxpod.LabelAgentKey])
		return nil, nil
	default:
		return r.deleteAfterStatus(pod), nil
	}
}

func (r *ExecutionReconciler) deleteAfterStatus(pod *corev1.Pod) func(context.Context) error {
	return func(ctx context.Context) error { return r.deletePod(ctx, pod) }
}

// resetTimeout bounds an interpreter reset; the pool controller deletes pods
// that stay resetting longer (the manager stopped during the reset).
const resetTimeout = time.Minute

// reset gives a pod released for reuse a fresh interpreter and returns it to
// the pool's idle pods, or deletes it when the reset fails.
func (r *ExecutionReconciler) reset(log logr.Logger, key client.ObjectKey, addr string, podUID types.UID, keyID string) {
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	defer cancel()
	resetErr := r.Runner.Reset(ctx, addr, podUID, keyID)
	pod := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, key, pod); err != nil {
		return // gone; nothing to return
	}
	if resetErr != nil {
		log.Info("could not reset the interpreter for reuse; deleting the pod", "err", resetErr.Error())
		if err := r.deletePod(ctx, pod); err != nil {
			log.Error(err, "delete pod after a failed reset")
		}
		return
	}
	if err := r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error { return claim.ReturnToPool(ctx, r.Client, p) }); err != nil {
		log.Error(err, "return reset pod to its pool")
	}
}

// retryOnConflict applies a pod update, re-reading the pod when it changed.
func (r *ExecutionReconciler) retryOnConflict(ctx context.Context, pod *corev1.Pod, update func(*corev1.Pod) error) error {
	p := pod.DeepCopy()
	for i := 0; ; i++ {
		err := update(p)
		if err == nil || i == 3 {
			return err
		}
		if err := r.APIReader.Get(ctx, clientKey(pod), p); err != nil {
			return err
		}
	}
}

// copyResult writes the agent's result into the status; the agent already cut
// stdout and stderr to the pool's maxOutputBytes.
func (r *ExecutionReconciler) copyResult(ex *sandboxv1alpha1.Execution, res *protocol.Result) {
	st := &ex.Status
	st.Stdout, st.Stderr = res.Stdout, res.Stderr
	st.StdoutTruncated, st.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
	if res.Result != nil {
		v := *res.Result
		if len(v) > sandboxv1alpha1.MaxResultBytes {
			v = v[:sandboxv1alpha1.MaxResultBytes] + fmt.Sprintf("... [%d bytes cut]", len(v)-sandboxv1alpha1.MaxResultBytes)
		}
		st.Result = v
	}
	if res.Error != nil {
		st.Error = &sandboxv1alpha1.ExecutionError{Type: res.Error.Type, Message: cut(res.Error.Message, 16384), Traceback: cut(res.Error.Traceback, 16384)}
	}
	if res.ExitCode != nil {
		c := int32(*res.ExitCode)
		st.ExitCode = &c
	}
	ms := int64(res.DurationMillis)
	st.DurationMillis = &ms
	st.Duration = (time.Duration(res.DurationMillis*1000) * time.Microsecond).Round(time.Millisecond).String()
	if res.DurationMillis < 1 {
		st.Duration = (time.Duration(res.DurationMillis*1000) * time.Microsecond).Round(time.Microsecond).String()
	}
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... [%d bytes cut]", len(s)-n)
}
