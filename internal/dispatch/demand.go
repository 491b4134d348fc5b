package dispatch

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Demand is the number of a pool's Executions and Sessions waiting for a
// fresh pod: the pods the pool should add beyond its idle replicas.
func (d *Dispatcher) Demand(key types.NamespacedName) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.pools[key]; p != nil {
		return p.demand(d.shares(p, false))
	}
	return 0
}

// Promised lists the pool's idle pods chosen for a claim that is not yet
// written on them. The pool counts them as taken: counted as idle, a pod
// promised to an Execution that waited makes a surplus of the pods starting
// for that Execution, one is deleted and, once the claim lands, started
// again (a cold claim cost a second start-up, found by the autoscaling
// benchmark). So is a pod a Running status names before its claim shows
// (heldBy): deleted as a surplus, the run stored Running on it, whose code
// is sent only once the claim is stored, could only be called lost.
func (d *Dispatcher) Promised(key types.NamespacedName) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[key]
	if p == nil {
		return nil
	}
	var out map[string]bool
	for name, pi := range p.pods {
		if (pi.idle && pi.assignedTo != nil) || (pi.session == "" && pi.claimedBy == "" && (p.namedBy[name] != "" || pi.heldBy != nil)) {
			if out == nil {
				out = map[string]bool{}
			}
			out[name] = true
		}
	}
	return out
}

// Waiting is the number of a pool's Executions that wait for a pod of any kind.
func (d *Dispatcher) Waiting(key types.NamespacedName) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[key]
	if p == nil {
		return 0
	}
	n := p.waiting
	for _, s := range p.sessions {
		n += s.queue.Len()
		if s.lease != nil && s.lease.poolIdx < 0 && s.lease.state == waiting {
			n++ // adopting its pod, not in the pool's queue
		}
	}
	return n
}

// OldestWaiting is the creation time of the pool's longest-waiting Execution
// or Session (zero when none waits): the queues are heaps ordered by it.
func (d *Dispatcher) OldestWaiting(key types.NamespacedName) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[key]
	if p == nil {
		return time.Time{}
	}
	var oldest time.Time
	consider := func(t time.Time) {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	for _, q := range p.tenants {
		for _, h := range []*entry{q.runs.peek(), q.leases.peek()} {
			if h != nil {
				consider(h.created)
			}
		}
	}
	for _, s := range p.sessions {
		if s.queue.Len() > 0 {
			consider(s.queue[0].e.created)
		}
		if s.lease != nil && s.lease.poolIdx < 0 && s.lease.state == waiting {
			consider(s.lease.created)
		}
	}
	return oldest
}

// WaitingOf lists a pool's waiting Executions (to tell them the pool changed).
func (d *Dispatcher) WaitingOf(key types.NamespacedName) []types.NamespacedName {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []types.NamespacedName
	for _, e := range d.execs {
		if e.pool.key == key && e.state != running && !e.lease {
			out = append(out, e.name)
		}
	}
	return out
}
