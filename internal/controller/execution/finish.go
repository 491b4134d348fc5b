package execution

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// finish turns a run's outcome into the final status and decides the pod's
// fate: a session keeps its pod while the interpreter's state is intact; a
// pool that reuses pods gets it back with a fresh interpreter; otherwise (and
// whenever the code did not end cleanly) the pod is deleted and the pool
// replaces it. Nothing happens to the pod here: the decision is part of the
// status, and dispose carries it out once that status is stored.
func (r *Reconciler) finish(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, o runner.Outcome) {
	clean := false
	var phase sandboxv1alpha1.ExecutionPhase
	var reason, msg string
	var execErr *sandboxv1alpha1.ExecutionError
	switch {
	case errors.Is(o.Err, runner.ErrBusy):
		// The Session's interpreter ran a data-plane run all along: nothing ran
		// here, and the interpreter is the Session's as it was.
		phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonSessionBusy
		msg = fmt.Sprintf("session %s's interpreter was running another run (through the data plane) until this Execution's "+
			"timeout of %s: the code never ran", ex.Spec.Session, timeoutOf(ex, pool))
		execErr = &sandboxv1alpha1.ExecutionError{Type: reason, Message: msg}
		clean = true
	case o.Err != nil:
		// The runner cancels a run for its user (spec.cancel) and on its own
		// (the pod lost, the deadline passed): only the first is Cancelled.
		// The second may reach here when the status its caller wrote was lost
		// (an API server that restarted): the pod's fate decides then.
		userCancel := o.Cancelled && ex.Spec.Cancel
		switch {
		case userCancel:
			phase, reason = sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled
		case errors.Is(o.Err, runner.ErrNoAnswer) && ex.Status.StartTime != nil &&
			r.now().After(ex.Status.StartTime.Add(timeoutOf(ex, pool))) && pod != nil && !sandboxpod.IsTerminal(pod):
			// An agent that still runs but did not answer by the deadline could
			// not stop the code. (A pod that ended lost the run, whatever the clock says.)
			phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
		default:
			phase, reason = sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonSandboxLost
		}
		msg = o.Err.Error() + "; the pod is deleted"
		if why, whyMsg := podstatus.End(pod); why != "" && !userCancel {
			reason, msg = why, whyMsg+" ("+msg+")"
		}
		execErr = &sandboxv1alpha1.ExecutionError{Type: reason, Message: msg}
		// The agent is gone with its result; what it streamed is all there is.
		ex.Status.Stdout, ex.Status.Stderr = o.Stdout, o.Stderr
	default:
		res := o.Result
		r.copyResult(ex, res)
		switch {
		case res.Error != nil && res.Error.Type == protocol.ErrorInterpreterRestarted:
			phase, reason = sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonSessionLost
			msg = fmt.Sprintf("session %s's interpreter died or was replaced since the session's last Execution, and with it "+
				"the session's state: the code did not run; start a new session", ex.Spec.Session)
			execErr = &sandboxv1alpha1.ExecutionError{Type: sandboxv1alpha1.ReasonSessionLost, Message: msg}
			res.StateLost = true
		case res.Status == protocol.StatusSucceeded:
			phase, reason, msg = sandboxv1alpha1.PhaseSucceeded, sandboxv1alpha1.ReasonSucceeded, "the code ran to its end"
		case res.Status == protocol.StatusTimedOut && res.Error != nil && res.Error.Type == protocol.ErrorInterpreterKilled:
			phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
			msg = fmt.Sprintf("the code did not stop at SIGINT at the timeout of %s and was killed %s later "+
				"(spec.executionDefaults.interruptGracePeriod)", timeoutOf(ex, pool), graceOf(pool))
		case res.Status == protocol.StatusTimedOut:
			phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
			msg = fmt.Sprintf("interrupted (KeyboardInterrupt) at the timeout of %s", timeoutOf(ex, pool))
		case res.Status == protocol.StatusInterrupted:
			// Only two parties interrupt: a cancel, and the runner at the deadline.
			phase, reason, msg = sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled, "interrupted on request"
			if !o.Cancelled && !ex.Spec.Cancel {
				phase, reason = sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.ReasonTimedOut
				msg = fmt.Sprintf("interrupted (KeyboardInterrupt) at the timeout of %s", timeoutOf(ex, pool))
			}
		default:
			phase, reason, msg = sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonError, "the code failed"
			if res.Error != nil {
				msg = res.Error.Type
				if res.Error.Message != "" {
					msg += ": " + res.Error.Message
				}
				if res.Error.Type == protocol.ErrorInterpreterDied {
					reason = protocol.ErrorInterpreterDied
				}
				if limit, advice := limitHit(res.Error, pool); limit != "" {
					reason, msg = limit, msg+"; "+advice
				}
			}
		}
		if res.StateLost {
			switch why := res.StateLostReason; {
			case why == "":
				msg += "; the interpreter was killed or died, so the pod is deleted"
			case strings.Contains(msg, why):
				msg += "; so the pod is deleted"
			default:
				msg += "; " + why + ", so the pod is deleted"
			}
		}
		clean = !res.StateLost
	}
	// A timeout always costs the pod unless a session keeps its (cleanly
	// interrupted) interpreter; so does a full disk, which a fresh interpreter
	// would inherit (a session may delete files and go on).
	if (phase == sandboxv1alpha1.PhaseTimedOut || reason == sandboxv1alpha1.ReasonDiskLimitReached) && ex.Spec.Session == "" &&
		reason != sandboxv1alpha1.ReasonSessionBusy {
		clean = false
	}
	var disposition sandboxv1alpha1.PodDisposition
	switch {
	case pod == nil || lease.ClaimedBy(pod) != ex.UID:
		// Gone, or not ours: nothing to do with it.
	case clean && ex.Spec.Session != "":
		disposition = sandboxv1alpha1.DispositionReleaseToSession
	case clean && pool.Spec.ReusePolicy == sandboxv1alpha1.ReuseFreshInterpreter:
		disposition = sandboxv1alpha1.DispositionReset
	default:
		disposition = sandboxv1alpha1.DispositionDelete
	}
	r.end(ex, phase, reason, msg, execErr, disposition)
}

// copyResult writes the agent's result into the status; the agent already cut
// stdout and stderr to the pool's maxOutputBytes.
func (r *Reconciler) copyResult(ex *sandboxv1alpha1.Execution, res *protocol.Result) {
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
	st.Results, st.Files = statusResults(res.Displays), statusFiles(res.Files)
	st.Interpreter = res.Interpreter
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

// statusResults keeps of each rich result its MIME types and its text: the
// content stays out of etcd.
func statusResults(displays []protocol.Display) []sandboxv1alpha1.ExecutionResult {
	var out []sandboxv1alpha1.ExecutionResult
	for _, d := range displays {
		if len(out) == sandboxv1alpha1.MaxStatusResults {
			break
		}
		types := make([]string, 0, len(d.Data))
		for m := range d.Data {
			types = append(types, m)
		}
		sort.Strings(types)
		if len(types) > 16 {
			types = types[:16]
		}
		var text string
		_ = json.Unmarshal(d.Data["text/plain"], &text)
		out = append(out, sandboxv1alpha1.ExecutionResult{MimeTypes: types, Text: cut(text, sandboxv1alpha1.MaxStatusResultText), Main: d.Main})
	}
	return out
}

func statusFiles(files []protocol.FileChange) []sandboxv1alpha1.ExecutionFile {
	var out []sandboxv1alpha1.ExecutionFile
	for _, f := range files {
		if len(out) == sandboxv1alpha1.MaxStatusFiles {
			break
		}
		out = append(out, sandboxv1alpha1.ExecutionFile{Path: f.Path, Size: f.Size})
	}
	return out
}
