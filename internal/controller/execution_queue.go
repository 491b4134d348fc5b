package controller

import (
	"sort"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// The queue policy: Executions of a pool take idle pods in creation order
// (FIFO; the name breaks ties). Executions of a session run one at a time in
// creation order, on the session's pod once it has one.

// fifoLess orders Executions by creation time, then name.
func fifoLess(a, b *sandboxv1alpha1.Execution) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// queue is the pool's waiting Executions that need a fresh pod, in FIFO order:
// those without a session, and the first waiting Execution of each session
// that has no pod yet and none running.
func queue(all []sandboxv1alpha1.Execution, sessionHasPod func(string) bool) []*sandboxv1alpha1.Execution {
	var waiting []*sandboxv1alpha1.Execution
	busySession := map[string]bool{}
	for i := range all {
		ex := &all[i]
		if ex.Spec.Session != "" && ex.Status.Phase == sandboxv1alpha1.PhaseRunning {
			busySession[ex.Spec.Session] = true
		}
		if isWaiting(ex) {
			waiting = append(waiting, ex)
		}
	}
	sort.Slice(waiting, func(i, j int) bool { return fifoLess(waiting[i], waiting[j]) })
	var out []*sandboxv1alpha1.Execution
	seenSession := map[string]bool{}
	for _, ex := range waiting {
		s := ex.Spec.Session
		if s != "" {
			if seenSession[s] || busySession[s] || sessionHasPod(s) {
				seenSession[s] = true
				continue
			}
			seenSession[s] = true
		}
		out = append(out, ex)
	}
	return out
}

// firstOfSession reports whether ex is the oldest waiting Execution of its
// session and no other Execution of the session is running.
func firstOfSession(all []sandboxv1alpha1.Execution, ex *sandboxv1alpha1.Execution) bool {
	for i := range all {
		o := &all[i]
		if o.Spec.Session != ex.Spec.Session || o.UID == ex.UID {
			continue
		}
		if o.Status.Phase == sandboxv1alpha1.PhaseRunning || (isWaiting(o) && fifoLess(o, ex)) {
			return false
		}
	}
	return true
}

// position returns ex's index in q, or -1.
func position(q []*sandboxv1alpha1.Execution, ex *sandboxv1alpha1.Execution) int {
	for i, o := range q {
		if o.UID == ex.UID {
			return i
		}
	}
	return -1
}
