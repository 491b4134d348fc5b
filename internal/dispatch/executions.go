package dispatch

import (
	"container/heap"
	"time"

	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// IsWaiting reports whether an Execution waits for a pod.
func IsWaiting(ex *sandboxv1alpha1.Execution) bool {
	return (ex.Status.Phase == "" || ex.Status.Phase == sandboxv1alpha1.PhasePending) && ex.Status.PodName == "" &&
		!ex.Spec.Cancel && ex.DeletionTimestamp == nil
}

// Before reports whether a goes before b in a queue: created earlier, or at
// the same time (creation times have whole seconds) with a lower name.
func Before(a, b *sandboxv1alpha1.Execution) bool {
	return before(a.CreationTimestamp.Time, a.Name, b.CreationTimestamp.Time, b.Name)
}

// UpdateExecution takes in an Execution as the informer (or a reconcile) saw it.
func (d *Dispatcher) UpdateExecution(ex *sandboxv1alpha1.Execution) {
	d.mu.Lock()
	w := d.updateExecution(ex)
	d.mu.Unlock()
	d.deliver(w)
}

func (d *Dispatcher) updateExecution(ex *sandboxv1alpha1.Execution) wakes {
	var w wakes
	e := d.execs[ex.UID]
	switch {
	case ex.Status.Phase.IsFinished() || ex.DeletionTimestamp != nil || (ex.Spec.Cancel && ex.Status.PodName == ""):
		if e != nil {
			d.remove(e, &w)
		}
	case ex.Status.PodName != "":
		if e == nil {
			e = d.newEntry(ex)
		}
		d.markRunning(e, ex.Status.PodName, &w)
	case e == nil:
		e = d.newEntry(ex)
		if e.session == "" {
			e.claim = true
			w.claims = append(w.claims, e)
		}
		d.enqueue(e, &w)
	case e.state == running:
		if pi := e.pool.pods[e.pod]; pi != nil && pi.claimedBy == e.uid {
			// Its claim says it runs: its Running status is written later,
			// if at all (a short run writes only its final status).
			break
		}
		// Waiting again: its claim did not commit, and a Running status
		// stored before it was taken back. The pod's own events say whether
		// it is free.
		d.requeue(e, &w)
	}
	return w
}

// unhold forgets that a Running status said e holds a pod before its claim
// showed, now that e no longer runs on it. The pod is handed out again at
// its next event, as after any hold: the status was taken back because
// someone else's claim is on its way to it.
func (d *Dispatcher) unhold(e *entry) {
	if e.state != running || e.pod == "" {
		return
	}
	if pi := e.pool.pods[e.pod]; pi != nil && pi.heldBy == e {
		pi.heldBy = nil
		if pi.pod == nil { // a place held for a pod never seen
			delete(e.pool.pods, e.pod)
		}
	}
}

// DeleteExecution forgets an Execution that was deleted.
func (d *Dispatcher) DeleteExecution(uid types.UID) {
	d.mu.Lock()
	var w wakes
	if e := d.execs[uid]; e != nil {
		d.remove(e, &w)
	}
	d.mu.Unlock()
	d.deliver(w)
}

// newEntry tracks an Execution, in no queue yet.
func (d *Dispatcher) newEntry(ex *sandboxv1alpha1.Execution) *entry {
	p := d.pool(ex.PoolKey())
	e := &entry{uid: ex.UID, name: types.NamespacedName{Namespace: ex.Namespace, Name: ex.Name}, pool: p,
		created: ex.CreationTimestamp.Time, seen: time.Now(), poolIdx: -1, sessionIdx: -1}
	if ex.Spec.Session != "" {
		e.session = sessionKey(ex.Namespace, ex.Spec.Session)
	}
	d.execs[ex.UID] = e
	return e
}

// requeue sends an entry whose pod fell through back to its place.
func (d *Dispatcher) requeue(e *entry, w *wakes) {
	d.unhold(e)
	d.unqueue(e)
	if e.session != "" {
		if s := e.pool.session(e.session); s.running == e.uid {
			s.running = ""
		}
	}
	d.enqueue(e, w)
}

// enqueue puts a waiting entry in its queue and dispatches.
func (d *Dispatcher) enqueue(e *entry, w *wakes) {
	e.state, e.pod = waiting, ""
	p := e.pool
	switch {
	case e.lease:
		s := p.session(e.session)
		s.lease = e
		d.syncSession(p, s, w)
	case e.session == "":
		p.push(e)
	default:
		s := p.session(e.session)
		heap.Push(&s.queue, queued{e, &e.sessionIdx})
		d.syncSession(p, s, w)
	}
	d.fill(p, w)
}

// remove forgets an entry and gives back what it held.
func (d *Dispatcher) remove(e *entry, w *wakes) {
	p := e.pool
	d.unhold(e)
	delete(d.execs, e.uid)
	d.unqueue(e)
	if e.state == assigned {
		d.unassignPod(p, e)
	}
	if e.session != "" {
		s := p.session(e.session)
		if s.running == e.uid {
			s.running = ""
		}
		if s.lease == e {
			s.lease = nil
		}
		d.syncSession(p, s, w)
		p.gcSession(s)
	}
	d.fill(p, w)
	d.gc(p)
}

// unqueue takes an entry out of the queues it is in.
func (d *Dispatcher) unqueue(e *entry) {
	p := e.pool
	if e.poolIdx >= 0 {
		p.unpush(e)
	}
	if e.sessionIdx >= 0 {
		heap.Remove(&p.session(e.session).queue, e.sessionIdx)
	}
}

// markRunning records that e claimed pod (a status or a claim seen).
func (d *Dispatcher) markRunning(e *entry, pod string, w *wakes) {
	if e.state == running && e.pod == pod {
		return
	}
	p := e.pool
	if e.state == running {
		d.unhold(e) // it runs on another pod than the one it held
	}
	d.unqueue(e)
	if e.state == assigned && e.pod != pod {
		d.unassignPod(p, e)
	}
	w.serve(e, p.pods[pod])
	if p.pods[pod] == nil && pod != "" {
		// The status came before the pod's first event (a restart's
		// informers): hold its place, so that the event finds it held.
		p.pods[pod] = &podInfo{name: pod}
	}
	if pi := p.pods[pod]; pi != nil {
		if pi.assignedTo == e {
			pi.assignedTo = nil
		}
		p.hold(pi, e)
	}
	e.state, e.pod = running, pod
	if e.session != "" {
		s := p.session(e.session)
		s.running = e.uid
		d.syncSession(p, s, w)
	}
	d.fill(p, w)
}
