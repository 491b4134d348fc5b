package execution

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Naming the limit that ended a run. The agent keeps the code within the
// pool's spec.limits (internal/agent/interpreter/limits.go) so that it fails
// with an error it can see; these rules turn such an error, or the pod's own
// end, into a reason a user can act on, with the knob to turn.

// limitHit returns the reason and advice for a failed run that reached one
// of the sandbox's limits, or "" if it did not.
func limitHit(e *protocol.Error, pool *sandboxv1alpha1.SandboxPool) (reason, advice string) {
	if e == nil {
		return "", ""
	}
	memory, processes := sandboxpod.CodeLimits(pool)
	switch {
	case e.Type == protocol.ErrorMemoryLimitExceeded || e.Type == "MemoryError":
		return sandboxv1alpha1.ReasonMemoryLimitExceeded, fmt.Sprintf("the code may use %d MiB in pool %s "+
			"(spec.resources.limits.memory less spec.limits.memoryReserve): use less, or raise the pool's memory limit",
			memory>>20, pool.Name)
	case processes > 0 && startedProcess(e):
		return sandboxv1alpha1.ReasonProcessLimitReached, fmt.Sprintf("the code could not start a process or thread: pool %s "+
			"allows %d processes and threads per sandbox, the agent's included (spec.limits.processes), and %d MiB of "+
			"memory per process, each thread's stack taking 2 MiB of it: start fewer, or raise the limits",
			pool.Name, processes, memory>>20)
	case noSpace(e):
		workspace, tmp := sandboxpod.ScratchSizes(pool)
		return sandboxv1alpha1.ReasonDiskLimitReached, fmt.Sprintf("a write found no space left: pool %s gives the code "+
			"%s in %s and %s in /tmp (spec.limits.workspaceSize, spec.limits.tmpSize): write less, delete what is "+
			"no longer needed, or raise the sizes", pool.Name, workspace.String(), sandboxpod.WorkspaceDir, tmp.String())
	}
	return "", ""
}

// noSpace: a write failed with ENOSPC, which Python raises as a plain OSError
// with errno 28.
func noSpace(e *protocol.Error) bool {
	return e.Type == "OSError" && strings.HasPrefix(e.Message, "[Errno 28] ")
}

// startedProcess: the code failed to start a process or a thread for want of
// resources (EAGAIN from fork or clone).
func startedProcess(e *protocol.Error) bool {
	if e.Type == "RuntimeError" && strings.Contains(e.Message, "can't start new thread") {
		return true
	}
	if e.Type != "BlockingIOError" || !strings.Contains(e.Message, "Resource temporarily unavailable") {
		return false
	}
	for _, call := range []string{"fork", "_execute_child", "spawn", "Popen"} {
		if strings.Contains(e.Traceback, call) {
			return true
		}
	}
	return false
}

// podEndWait is how long a run whose agent stopped answering before its
// timeout waits for the kubelet to say why (it reports a killed container a
// second or two after the connection broke), so that an OOM kill or an
// eviction is named as such rather than as SandboxLost.
const podEndWait = 10 * time.Second

// waitForPodEnd returns how long to wait before finishing a run that ended
// without an answer on a pod still running, 0 to finish now.
func waitForPodEnd(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, o runner.Outcome) time.Duration {
	if o.Err == nil || !errors.Is(o.Err, runner.ErrNoAnswer) || o.Cancelled || pod == nil || sandboxpod.IsTerminal(pod) {
		return 0
	}
	if ex.Status.StartTime != nil && !o.At.Before(ex.Status.StartTime.Add(timeoutOf(ex, pool))) {
		return 0 // the run's own deadline passed: that is the answer
	}
	// The wall clock, as the runner's o.At: this waits for the kubelet to
	// report the pod's end, real time, not a policy the injected clock decides.
	if left := time.Until(o.At.Add(podEndWait)); left > 0 {
		return min(left, time.Second)
	}
	return 0
}
