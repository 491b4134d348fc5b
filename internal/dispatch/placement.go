package dispatch

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// unassignPod gives back the pod chosen for e, if it is still free.
func (d *Dispatcher) unassignPod(p *pool, e *entry) {
	if pi := p.pods[e.pod]; pi != nil && pi.assignedTo == e {
		pi.assignedTo = nil
		if pi.idle {
			p.idle[pi.name] = pi
		}
	}
}

// hold records that a status says e holds pi: not free any more, whatever
// the pod's last event said, and e's namespace's until the pod's next event
// tells. A shared pool counts a tenant's pods from this: a pod held by no one
// in between would let the tenant past its limits and into the reserve.
func (p *pool) hold(pi *podInfo, e *entry) {
	pi.idle, pi.sessionFree = false, false
	delete(p.idle, pi.name)
	if pi.claimedBy == "" && pi.session == "" {
		pi.heldBy = e
	}
}

// fill hands the pool's idle pods to the heads of its queues (fairshare.go).
func (d *Dispatcher) fill(p *pool, w *wakes) {
	var shares map[string]*share
	if p.waiting > 0 {
		shares = d.shares(p, false) // also what the demand below counts against
		for len(p.idle) > 0 {
			e, pi := p.next(shares)
			if e == nil {
				break
			}
			p.unpush(e)
			shares[e.name.Namespace].take(e.lease)
			if e.lease {
				p.session(e.session).running = e.uid
			}
			d.assign(p, e, pi, w)
		}
	}
	if n := p.demand(shares); n != p.lastDemand {
		p.lastDemand = n
		w.pools = append(w.pools, p.key)
	}
}

func (d *Dispatcher) assign(p *pool, e *entry, pi *podInfo, w *wakes) {
	delete(p.idle, pi.name)
	pi.assignedTo = e
	e.state, e.pod, e.chosen = assigned, pi.name, time.Now()
	w.wake(e)
}

// pickIdle returns an idle pod that may run namespace ns's code: one that
// already ran ns's (a reused pod of a shared pool) before a fresh one, one
// built from the current template before an older one, and the lowest name
// among equals, so choices are reproducible. Linear in the idle pods, which
// are the pool's warm replicas: few.
func (p *pool) pickIdle(ns string) *podInfo {
	var best *podInfo
	rank := func(pi *podInfo) (bool, bool) { return pi.tenant == ns, pi.current }
	for _, pi := range p.idle {
		if pi.tenant != "" && pi.tenant != ns {
			continue
		}
		if best == nil {
			best = pi
			continue
		}
		mine, cur := rank(pi)
		bmine, bcur := rank(best)
		if (mine && !bmine) || (mine == bmine && ((cur && !bcur) || (cur == bcur && pi.name < best.name))) {
			best = pi
		}
	}
	return best
}

// Place returns what the dispatcher decided for a waiting Execution, taking
// it in first if no event brought it yet.
func (d *Dispatcher) Place(ex *sandboxv1alpha1.Execution) Placement {
	return d.place(ex.UID, false, func() wakes { return d.updateExecution(ex) })
}

// PlaceSession is Place for a Session that waits for its pod.
func (d *Dispatcher) PlaceSession(ses *sandboxv1alpha1.Session) Placement {
	// Taken in again even when known: its wait for the data plane's pod may be over.
	return d.place(ses.UID, true, func() wakes { return d.updateSession(ses) })
}

func (d *Dispatcher) place(uid types.UID, always bool, takeIn func() wakes) Placement {
	d.mu.Lock()
	var w wakes
	e := d.execs[uid]
	if e == nil || always {
		w = takeIn()
		e = d.execs[uid]
	}
	var pl Placement
	if e != nil {
		pl = d.placement(e)
		// The object being reconciled needs no wake-up of its own.
		w.unwake(e)
	}
	d.mu.Unlock()
	d.deliver(w)
	return pl
}

func (w *wakes) unwake(e *entry) {
	w.execs = without(w.execs, e.name)
	w.sessions = without(w.sessions, e.name)
}

func without(names []types.NamespacedName, n types.NamespacedName) []types.NamespacedName {
	out := names[:0]
	for _, x := range names {
		if x != n {
			out = append(out, x)
		}
	}
	return out
}

func (d *Dispatcher) placement(e *entry) Placement {
	var pl Placement
	if e.state == assigned {
		pl.Pod = e.pod
	}
	s := e.pool.session(e.session)
	if e.lease || e.session == "" {
		pl.NeedsFreshPod = e.state == waiting && s.pod == ""
		if e.lease && e.state == waiting {
			pl.SessionPod = s.pod // the pod it waits to adopt
		}
		if pl.NeedsFreshPod && e.pool.shared() && e.poolIdx >= 0 {
			pl.OverWaitingLimit = e.pool.overWaitingLimit(e)
			if sh := d.shares(e.pool, false)[e.name.Namespace]; sh != nil && sh.admitted {
				pl.TenantLimit = !sh.mayTake(e.lease)
			}
		}
		return pl
	}
	pl.SessionPod = s.pod
	pl.NoSessionPod = s.pod == ""
	pl.SessionBusy = e.state == waiting && s.pod != ""
	return pl
}

// ClaimFailed puts an Execution whose claim of pod did not commit back in its
// place. The pod, as last seen at resourceVersion rv, is not chosen again
// until an event shows it anew.
func (d *Dispatcher) ClaimFailed(uid types.UID, pod, rv string) {
	d.mu.Lock()
	var w wakes
	if e := d.execs[uid]; e != nil && e.state == assigned && e.pod == pod {
		p := e.pool
		if pi := p.pods[pod]; pi != nil {
			pi.assignedTo = nil
			if pi.rv == rv {
				pi.idle, pi.sessionFree = false, false
			} else if pi.idle {
				p.idle[pod] = pi
			}
		}
		d.requeue(e, &w)
		w.unwake(e)
	}
	d.mu.Unlock()
	d.deliver(w)
}
