package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

func (h *harness) list() []sandboxv1alpha1.Execution {
	var list sandboxv1alpha1.ExecutionList
	for i := 0; i < 100; i++ {
		if err := h.k8s.List(context.Background(), &list, client.InNamespace(ns)); err == nil {
			return list.Items
		}
		time.Sleep(200 * time.Millisecond)
	}
	h.t.Fatal("cannot list Executions")
	return nil
}

// waitAllFinished waits until every Execution ended, or the deadline.
func (h *harness) waitAllFinished(deadline time.Time) {
	for time.Now().Before(deadline) {
		open := 0
		for _, ex := range h.list() {
			if !ex.Status.Phase.IsFinished() {
				open++
			}
		}
		if open == 0 {
			return
		}
		time.Sleep(time.Second)
	}
}

// watchIdleWaits samples the pools: an Execution that waits for a fresh pod
// while its pool has an idle one, for longer than idleBound, is a violation.
func (h *harness) watchIdleWaits(stop <-chan struct{}) {
	since := map[types.UID]time.Time{}
	flagged := map[types.UID]bool{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
		if h.leader() < 0 {
			// Nobody dispatches between leaders: waits count from the next one.
			clear(since)
			continue
		}
		var pods corev1.PodList
		if h.k8s.List(context.Background(), &pods, client.InNamespace(ns)) != nil {
			continue
		}
		idle := map[string]int{}
		for i := range pods.Items {
			p := &pods.Items[i]
			if sandboxpod.IsIdle(p) && lease.ClaimedBy(p) == "" && lease.Session(p) == "" {
				idle[p.Labels[sandboxpod.LabelPool]]++
			}
		}
		now := time.Now()
		seen := map[types.UID]bool{}
		for _, ex := range h.list() {
			waiting := (ex.Status.Phase == "" || ex.Status.Phase == sandboxv1alpha1.PhasePending) && ex.Spec.Session == "" && !ex.Spec.Cancel
			if !waiting || idle[ex.Spec.PoolRef.Name] == 0 {
				continue
			}
			seen[ex.UID] = true
			if _, ok := since[ex.UID]; !ok {
				since[ex.UID] = now
			}
			d := now.Sub(since[ex.UID])
			h.mu.Lock()
			h.idleWaitMax = max(h.idleWaitMax, d)
			if d > idleBound && !flagged[ex.UID] {
				flagged[ex.UID] = true
				h.idleViolations = append(h.idleViolations, fmt.Sprintf("%s waited %s with %d idle pod(s) in pool %s",
					ex.Name, d.Round(time.Second), idle[ex.Spec.PoolRef.Name], ex.Spec.PoolRef.Name))
			}
			h.mu.Unlock()
		}
		for uid := range since {
			if !seen[uid] {
				delete(since, uid)
			}
		}
	}
}

// settle lets the managers finish the pod dispositions and the pools refill.
func (h *harness) settle() {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if len(h.leaked()) == 0 {
			return
		}
		time.Sleep(time.Second)
	}
}

// leaked lists pods held for an Execution that has ended or is gone, and
// pods stuck in a reset.
func (h *harness) leaked() []string {
	var pods corev1.PodList
	if h.k8s.List(context.Background(), &pods, client.InNamespace(ns)) != nil {
		return []string{"(cannot list pods)"}
	}
	var out []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if sandboxpod.IsTerminal(p) {
			continue
		}
		if uid := lease.ClaimedBy(p); uid != "" {
			ex := &sandboxv1alpha1.Execution{}
			err := h.k8s.Get(context.Background(), keyOf(p.Annotations[sandboxpod.AnnotationClaimedBy]), ex)
			if apierrors.IsNotFound(err) || (err == nil && (ex.UID != uid || ex.Status.Phase.IsFinished())) {
				out = append(out, p.Name+" claimed by ended "+p.Annotations[sandboxpod.AnnotationClaimedBy])
			}
		}
		if since, ok := lease.ResetSince(p); ok && time.Since(since) > 2*time.Minute {
			out = append(out, p.Name+" stuck resetting")
		}
	}
	return out
}

// report is what the run shows.
type report struct {
	seed                                             int64
	elapsed                                          time.Duration
	total                                            int
	outcomes                                         map[string]int
	faults                                           map[string]int
	lost, doubleRuns, wrong, isolation, leaked       int
	idleViolations                                   int
	maxIdleWait, maxLatency                          time.Duration
	slowest                                          string
	examples                                         []string
	succeeded, faultEnded, sessionLost, runsRecorded int
	// resumes counts the suspending Sessions' resumes; snapshotLost the
	// Sessions lost for a reason other than their pod dying under them.
	resumes, snapshotLost int
	// agentsNotRestarted: pods whose agent had exited, found not yet Failed
	// (the status write failed with the API server away); the kubelet
	// stand-in starts no second agent there, as RestartPolicy Never says.
	agentsNotRestarted int
}

func (h *harness) check() report {
	r := report{outcomes: map[string]int{}, faults: map[string]int{}}
	h.mu.Lock()
	for k, v := range h.faults {
		r.faults[k] = v
	}
	expected := h.expected
	r.idleViolations, r.maxIdleWait = len(h.idleViolations), h.idleWaitMax
	for _, v := range h.idleViolations {
		if len(r.examples) < 20 {
			r.examples = append(r.examples, "idle wait: "+v)
		}
	}
	h.mu.Unlock()

	r.agentsNotRestarted = h.kubelet.NotRestarted()
	runs := map[string]int{}
	starts := map[string][]string{} // name -> "when where pid" of each start
	data, _ := os.ReadFile(h.runLog)
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			name, where, _ := strings.Cut(l, " ")
			runs[name]++
			starts[name] = append(starts[name], where)
			r.runsRecorded++
		}
	}
	example := func(format string, a ...any) {
		if len(r.examples) < 20 {
			r.examples = append(r.examples, fmt.Sprintf(format, a...))
		}
	}
	for _, ex := range h.list() {
		exp, ok := expected[ex.Name]
		if !ok {
			continue
		}
		r.total++
		reason := ""
		if c := condition(ex.Status.Conditions); c != "" {
			reason = c
		}
		r.outcomes[string(ex.Status.Phase)+"/"+reason]++
		if !ex.Status.Phase.IsFinished() {
			r.lost++
			why := ""
			for _, c := range ex.Status.Conditions {
				why += fmt.Sprintf(" [%s=%s %s: %s]", c.Type, c.Status, c.Reason, c.Message)
			}
			example("lost: %s still %s%s; pool: %s", ex.Name, ex.Status.Phase, why, h.poolState(ex.Spec.PoolRef.Name))
			continue
		}
		if d := ex.Status.CompletionTime.Sub(ex.CreationTimestamp.Time); d > r.maxLatency {
			r.maxLatency = d
			r.slowest = fmt.Sprintf("%s ended %s/%s after %s (started %s after creation)", ex.Name, ex.Status.Phase, reason,
				d.Round(time.Millisecond), startDelay(&ex))
		}
		if n := runs[ex.Name]; n > 1 {
			r.doubleRuns++
			start := ""
			if ex.Status.StartTime != nil {
				start = ex.Status.StartTime.Format("15:04:05.000")
			}
			example("double run: %s (uid %s) ran %d times; ended %s/%s on %s, started %s, disposition %s; the starts (unix time, workspace, interpreter): %s",
				ex.Name, ex.UID, n, ex.Status.Phase, reason, ex.Status.PodName, start, ex.Status.PodDisposition, strings.Join(starts[ex.Name], "; "))
		}
		// Outcomes a fault explains: the pod, agent or interpreter went away.
		// A suspending Session is lost only by its pod dying while it held
		// it, never by a suspend or a resume.
		if exp.kind == kindSuspend && reason == sandboxv1alpha1.ReasonSessionLost {
			if why := h.sessionReason(exp.session); why != sandboxv1alpha1.ReasonSandboxLost && why != sandboxv1alpha1.ReasonInterpreterRestarted {
				r.snapshotLost++
				example("suspending Session %s lost (%s): %s", exp.session, why, h.sessionHistory(exp.session))
			}
		}
		faulted := reason == sandboxv1alpha1.ReasonSandboxLost || reason == "InterpreterDied" ||
			((exp.kind == kindSession || exp.kind == kindSuspend) && reason == sandboxv1alpha1.ReasonSessionLost)
		if faulted {
			r.faultEnded++
			if reason == sandboxv1alpha1.ReasonSessionLost {
				r.sessionLost++
			}
			continue
		}
		want := map[kind]string{kindPlain: "Succeeded", kindRaise: "Failed", kindTimeout: "TimedOut", kindCancel: "Cancelled",
			kindSelfKill: "Failed", kindFresh: "Succeeded", kindSession: "Succeeded", kindSuspend: "Succeeded"}[exp.kind]
		if ex.Status.Error != nil && strings.Contains(ex.Status.Error.Message, "session state of") {
			r.isolation++
			example("isolation: %s saw %s", ex.Name, ex.Status.Error.Message)
			continue
		}
		switch {
		case string(ex.Status.Phase) != want:
			r.wrong++
			if exp.session != "" && len(r.examples) < 20 {
				example("session %s: %s", exp.session, h.sessionHistory(exp.session))
			}
			example("wrong phase: %s (%s) ended %s/%s, want %s: %+v", ex.Name, exp.kind, ex.Status.Phase, reason, want, ex.Status.Error)
		case ex.Status.Phase == sandboxv1alpha1.PhaseSucceeded:
			r.succeeded++
			if ex.Status.Result != exp.result || (exp.stdout != "" && ex.Status.Stdout != exp.stdout) {
				r.wrong++
				if exp.session != "" && len(r.examples) < 20 {
					example("session %s: %s", exp.session, h.sessionHistory(exp.session))
				}
				example("wrong result: %s gave %q / %q, want %q / %q", ex.Name, ex.Status.Result, ex.Status.Stdout, exp.result, exp.stdout)
			}
		case exp.kind == kindRaise && (ex.Status.Error == nil || ex.Status.Error.Type != "ValueError"):
			r.wrong++
			example("wrong error: %s: %+v", ex.Name, ex.Status.Error)
		case exp.kind == kindSelfKill && reason != "InterpreterDied":
			r.wrong++
			example("wrong reason: %s ended %s", ex.Name, reason)
		}
	}
	for _, l := range h.leaked() {
		r.leaked++
		example("leaked: %s", l)
	}
	var sessions sandboxv1alpha1.SessionList
	if h.k8s.List(context.Background(), &sessions, client.InNamespace(ns)) == nil {
		for _, s := range sessions.Items {
			r.resumes += int(s.Status.Resumes)
		}
	}
	return r
}

// sessionReason is the reason of a Session's Ready condition.
func (h *harness) sessionReason(name string) string {
	s := &sandboxv1alpha1.Session{}
	if err := h.k8s.Get(context.Background(), keyOf(name), s); err != nil {
		return "unknown: " + err.Error()
	}
	for _, c := range s.Status.Conditions {
		if c.Type == sandboxv1alpha1.SessionConditionReady {
			return c.Reason
		}
	}
	return ""
}

func condition(conds []metav1.Condition) string {
	for _, c := range conds {
		if c.Type == sandboxv1alpha1.ExecutionConditionComplete {
			return c.Reason
		}
	}
	return ""
}

func (r report) summary() string {
	return fmt.Sprintf("lost %d, double runs %d, wrong results %d, session isolation %d, leaked pods %d, long waits with an idle pod %d, "+
		"Sessions lost by a suspend or resume %d", r.lost, r.doubleRuns, r.wrong, r.isolation, r.leaked, r.idleViolations, r.snapshotLost)
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run: seed %d, %d Executions in %s\n", r.seed, r.total, r.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "faults injected: %s\n", sortedCounts(r.faults))
	fmt.Fprintf(&b, "outcomes (phase/reason): %s\n", sortedCounts(r.outcomes))
	fmt.Fprintf(&b, "succeeded with the right result: %d; ended by a fault (SandboxLost, InterpreterDied, SessionLost): %d (SessionLost %d)\n",
		r.succeeded, r.faultEnded, r.sessionLost)
	fmt.Fprintf(&b, "suspending Sessions: %d resumes, %d lost by a suspend or resume\n", r.resumes, r.snapshotLost)
	fmt.Fprintf(&b, "code starts recorded: %d; agents not restarted after an exit the API server did not hear of: %d\n",
		r.runsRecorded, r.agentsNotRestarted)
	fmt.Fprintf(&b, "invariants: %s\n", r.summary())
	fmt.Fprintf(&b, "longest creation-to-end: %s; longest wait while an idle pod was free: %s (bound %s)\n",
		r.maxLatency.Round(time.Millisecond), r.maxIdleWait.Round(time.Millisecond), idleBound)
	fmt.Fprintf(&b, "slowest: %s\n", r.slowest)
	for _, e := range r.examples {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func startDelay(ex *sandboxv1alpha1.Execution) string {
	if ex.Status.StartTime == nil {
		return "never"
	}
	return ex.Status.StartTime.Sub(ex.CreationTimestamp.Time).Round(time.Millisecond).String()
}

// poolState describes a pool for a report: its conditions and pods.
func (h *harness) poolState(name string) string {
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := h.k8s.Get(context.Background(), keyOf(name), pool); err != nil {
		return err.Error()
	}
	out := fmt.Sprintf("replicas %d idle %d busy %d pending %d;", pool.Status.Replicas, pool.Status.IdleReplicas,
		pool.Status.BusyReplicas, pool.Status.PendingExecutions)
	for _, c := range pool.Status.Conditions {
		out += fmt.Sprintf(" [%s=%s %s: %s]", c.Type, c.Status, c.Reason, c.Message)
	}
	var pods corev1.PodList
	_ = h.k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelPool: name})
	for _, p := range pods.Items {
		out += fmt.Sprintf(" pod %s %s ready=%v state=%s claimed=%s;", p.Name, p.Status.Phase, sandboxpod.IsReady(&p),
			p.Labels[sandboxpod.LabelState], p.Annotations[sandboxpod.AnnotationClaimedBy])
	}
	return out
}

// sessionHistory lists a session's Executions: pod, interpreter, outcome.
func (h *harness) sessionHistory(session string) string {
	var list sandboxv1alpha1.ExecutionList
	_ = h.k8s.List(context.Background(), &list, client.InNamespace(ns))
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	out := ""
	for _, ex := range list.Items {
		if ex.Spec.Session == session {
			start := ""
			if ex.Status.StartTime != nil {
				start = ex.Status.StartTime.Format("15:04:05")
			}
			out += fmt.Sprintf("%s created %s on %s interp %.6s %s/%s result %s started %s; ", ex.Name, ex.CreationTimestamp.Format("15:04:05"),
				ex.Status.PodName, ex.Status.Interpreter, ex.Status.Phase, condition(ex.Status.Conditions), ex.Status.Result, start)
		}
	}
	return out
}
