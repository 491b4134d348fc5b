package dispatch

import (
	"container/heap"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/tenancy"
)

// A pool's waiting work is queued per tenant namespace: its own namespace
// and, for a shared pool, every namespace that uses it. A free pod goes to
// the admitted tenant that holds the fewest pods for its weight (pods held /
// weight; the oldest waiting first among equals), within the tenant's limits
// (and, unless it holds none and waits for no more than the pool's
// reservedIdlePods, while more than those are idle), and within the tenant first come, first served. So one namespace's burst
// of a thousand waits behind another namespace's single run only for that
// run's turn, never for the whole burst; a pool of one namespace serves it
// in creation order, as before.

// tenantQueue holds one namespace's work waiting for a fresh pod of the pool.
type tenantQueue struct {
	ns string
	// runs are Executions outside a session; leases are Sessions waiting
	// for their pod, kept apart so a tenant at its Session limit still runs
	// its plain Executions.
	runs, leases entryHeap
}

func (q *tenantQueue) heapFor(e *entry) *entryHeap {
	if e.lease {
		return &q.leases
	}
	return &q.runs
}

func (q *tenantQueue) len() int { return q.runs.Len() + q.leases.Len() }

func (p *pool) tenantQueue(ns string) *tenantQueue {
	q := p.tenants[ns]
	if q == nil {
		q = &tenantQueue{ns: ns}
		p.tenants[ns] = q
	}
	return q
}

// push queues a waiting entry for a fresh pod.
func (p *pool) push(e *entry) {
	heap.Push(p.tenantQueue(e.name.Namespace).heapFor(e), queued{e, &e.poolIdx})
	p.waiting++
}

// unpush takes an entry out of the pool's queue.
func (p *pool) unpush(e *entry) {
	q := p.tenants[e.name.Namespace]
	heap.Remove(q.heapFor(e), e.poolIdx)
	p.waiting--
	if q.len() == 0 {
		delete(p.tenants, q.ns)
	}
}

// share is what one tenant holds of the pool and may still take.
type share struct {
	policy   tenancy.Policy
	admitted bool
	pods     int // running Executions, Sessions and pods chosen for either
	sessions int
}

func (s *share) mayTake(lease bool) bool {
	if !s.admitted || (s.policy.MaxPods >= 0 && s.pods >= int(s.policy.MaxPods)) {
		return false
	}
	return !lease || s.policy.MaxSessions < 0 || s.sessions < int(s.policy.MaxSessions)
}

func (s *share) take(lease bool) {
	s.pods++
	if lease {
		s.sessions++
	}
}

// mayTakeReserved: the reserved idle pods are for a namespace that holds
// none of the pool's pods and whose waiting work they can cover; not for
// one whose burst holds none for a moment between two of its runs.
func mayTakeReserved(s *share, q *tenantQueue, reserve int) bool {
	return s.pods == 0 && q.len() <= reserve
}

// reservedIdle is how many idle pods only namespaces holding none may take.
func (p *pool) reservedIdle() int { return tenancy.ReservedIdle(p.obj) }

// shared reports whether the pool's own namespace may not be the only one
// it serves: then tenants are counted.
func (p *pool) shared() bool { return p.obj != nil && p.obj.Spec.Sharing != nil }

// shares returns what each tenant with work waiting (or, with all, each
// tenant at all) holds of the pool. Linear in the pool's pods, and only for
// shared pools: a pool of one namespace has no limits to count against.
func (d *Dispatcher) shares(p *pool, all bool) map[string]*share {
	out := map[string]*share{}
	get := func(ns string) *share {
		s := out[ns]
		if s == nil {
			s = &share{policy: tenancy.PolicyFor(p.obj, ns), admitted: d.admitted(p, ns)}
			out[ns] = s
		}
		return s
	}
	for ns := range p.tenants {
		get(ns)
	}
	if !p.shared() {
		return out
	}
	for _, pi := range p.pods {
		switch {
		case pi.assignedTo != nil:
			if s := out[pi.assignedTo.name.Namespace]; s != nil || all {
				get(pi.assignedTo.name.Namespace).take(pi.assignedTo.lease)
			}
		case pi.claimedBy != "" || pi.session != "":
			if s := out[pi.tenant]; (s != nil || all) && pi.tenant != "" {
				s = get(pi.tenant)
				s.pods++
				if pi.session != "" {
					s.sessions++
				}
			}
		case pi.heldBy != nil: // a status names it; its pod event has not come yet
			if s := out[pi.heldBy.name.Namespace]; s != nil || all {
				get(pi.heldBy.name.Namespace).take(pi.heldBy.lease)
			}
		}
	}
	return out
}

// admitted reports whether ns may use the pool's pods.
func (d *Dispatcher) admitted(p *pool, ns string) bool {
	if ns == p.key.Namespace {
		return true // its pods are usable (Usable) only once the pool is seen
	}
	return p.obj != nil && d.o.Admitted != nil && d.o.Admitted(p.obj, ns)
}

// next returns the entry that gets a fresh pod next, and that pod; nil when
// no waiting tenant may take one of the idle pods.
func (p *pool) next(shares map[string]*share) (*entry, *podInfo) {
	var best *entry
	var bestPod *podInfo
	var bestScore float64
	for ns, q := range p.tenants {
		s := shares[ns]
		var head *entry
		for _, h := range []*entry{q.runs.peek(), q.leases.peek()} {
			if h != nil && s.mayTake(h.lease) && (head == nil || before(h.created, h.name.Name, head.created, head.name.Name)) {
				head = h
			}
		}
		if head == nil || (len(p.idle) <= p.reservedIdle() && !mayTakeReserved(s, q, p.reservedIdle())) {
			continue
		}
		score := float64(s.pods) / float64(max(s.policy.Weight, 1))
		if best != nil && (score > bestScore || (score == bestScore && !before(head.created, head.name.Name, best.created, best.name.Name))) {
			continue
		}
		if pi := p.pickIdle(ns); pi != nil {
			best, bestPod, bestScore = head, pi, score
		}
	}
	return best, bestPod
}

// demand is the number of waiting entries that could take a fresh pod now
// (admitted, within their tenant's limits): what the pool should add.
// shares are the pool's (shares(p, false)).
func (p *pool) demand(shares map[string]*share) int {
	n := 0
	for ns, s := range shares {
		q := p.tenants[ns]
		if !s.admitted || q == nil {
			continue
		}
		w := q.runs.Len()
		if s.policy.MaxSessions < 0 {
			w += q.leases.Len()
		} else {
			w += min(q.leases.Len(), max(int(s.policy.MaxSessions)-s.sessions, 0))
		}
		if s.policy.MaxPods >= 0 {
			w = min(w, max(int(s.policy.MaxPods)-s.pods, 0))
		}
		n += w
	}
	return n
}

// overWaitingLimit reports whether e is beyond its tenant's maxWaiting: more
// of the tenant's Executions waited for a pod before it than the limit allows.
func (p *pool) overWaitingLimit(e *entry) bool {
	if e.lease || e.poolIdx < 0 || !p.shared() {
		return false
	}
	limit := tenancy.PolicyFor(p.obj, e.name.Namespace).MaxWaiting
	q := p.tenants[e.name.Namespace]
	if limit < 0 || q == nil || q.runs.Len() <= int(limit) {
		return false
	}
	ahead := 0
	for _, o := range q.runs {
		if before(o.e.created, o.e.name.Name, e.created, e.name.Name) {
			ahead++
		}
	}
	return ahead >= int(limit)
}

// Tenants returns what each namespace holds of and waits for in a shared
// pool, those holding the most first; nil for a pool that is not shared.
func (d *Dispatcher) Tenants(key types.NamespacedName) []sandboxv1alpha1.TenantUsage {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[key]
	if p == nil || !p.shared() {
		return nil
	}
	var out []sandboxv1alpha1.TenantUsage
	for ns, s := range d.shares(p, true) {
		if !s.admitted && s.pods == 0 && s.sessions == 0 {
			// Its work waits with a reason of its own; it is no tenant. One
			// that lost its admission but still holds a pod is listed until
			// it gives it back.
			continue
		}
		u := sandboxv1alpha1.TenantUsage{Namespace: ns, Pods: int32(s.pods), Sessions: int32(s.sessions)}
		if q := p.tenants[ns]; q != nil {
			u.Waiting = int32(q.len())
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pods != out[j].Pods {
			return out[i].Pods > out[j].Pods
		}
		return out[i].Namespace < out[j].Namespace
	})
	return out
}
