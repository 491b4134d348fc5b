// Package dispatch matches waiting Executions to free sandbox pods: one queue
// per pool, kept in memory and fed by the watch events of Executions, pods
// and pools (the way Kueue keeps its queues), so a pod that frees up goes to
// the head of the queue at once, and each event costs O(log n) in the number
// of waiting Executions instead of a sort of the whole pool per reconcile.
//
// The dispatcher decides; the claim written on the pod commits
// (internal/lease). A decision can fail to commit (the pod changed, another
// manager claimed it, the cache was stale): the Execution then goes back to
// its place in the queue and the pod waits for its next event. Nothing is
// lost when the manager restarts: the queues are rebuilt from the informers'
// initial lists, and the claims on the pods say who runs where.
//
// The order: Executions and Sessions of a pool take fresh pods first come,
// first served (creation time, then name) within their namespace, and
// shared fairly among the namespaces of a shared pool (fairshare.go). A Session takes one pod for its
// whole life (its lease); the Executions naming the Session run one at a time
// in creation order on that pod, and wait while the Session has none.
package dispatch

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Placement is what the dispatcher knows of one waiting Execution.
type Placement struct {
	// Pod is the pod chosen for it, to claim now; empty while it waits.
	Pod string
	// SessionPod is the session's pod, when the session has one.
	SessionPod string
	// SessionBusy: another Execution of the session runs, or waits before it.
	SessionBusy bool
	// NoSessionPod: the Execution's Session holds no pod (yet).
	NoSessionPod bool
	// NeedsFreshPod: it waits for a fresh pod (an Execution without a
	// session, or a Session).
	NeedsFreshPod bool
	// TenantLimit, when it waits for a fresh pod of a shared pool: its
	// namespace holds the pods (or Sessions) its limit allows.
	TenantLimit bool
	// OverWaitingLimit: more of its namespace's Executions wait for the
	// shared pool before it than the namespace's maxWaiting.
	OverWaitingLimit bool
}

// Claimed is how one claim of a pool's pod was served.
type Claimed struct {
	// Namespace is the claim's: a shared pool's tenant.
	Namespace string
	// Warm: the pod it got was Ready before the claim was made (it waited
	// for no start).
	Warm bool
	// Queued is how long it waited in this dispatcher, from when it was seen
	// until its pod was chosen (fair sharing decides this part); Chosen is
	// false when no pod was chosen for it here (its claim came first).
	Queued time.Duration
	Chosen bool
}

// Options are the Dispatcher's callbacks, given when it is built: the
// wake-ups it delivers and what it asks of the rest of the manager.
type Options struct {
	// WakeExecution asks for a reconcile of an Execution the dispatcher chose a
	// pod for, or whose place changed in a way its status reports.
	WakeExecution func(types.NamespacedName)
	// WakeSession asks for a reconcile of a Session the dispatcher chose a pod for.
	WakeSession func(types.NamespacedName)
	// WakePool asks for a reconcile of a pool whose demand for fresh pods changed.
	WakePool func(types.NamespacedName)
	// Usable reports whether a pod labelled with a pool's name may serve a
	// run (lease.MayServe: the pool owns it and the manager has its key, and
	// a pod not yet held by a session is built as the pool builds its pods);
	// unusable pods are never chosen. pool is nil until the pool's first event: then none is.
	// Nil: all are usable.
	Usable func(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) bool
	// Placeable reports whether an idle pod may be handed out for new work:
	// not on a node the pool may no longer use (cordoned, draining, tainted,
	// not Ready: internal/nodes). A Session's own pod there still serves
	// the Session's runs. Nil: all are.
	Placeable func(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) bool
	// OnClaim hears of each new claim of a pool's pod (an Execution outside
	// a session, a Session), at its creation time, once: the demand the
	// pool's autoscaler plans for. Called without the dispatcher's lock.
	OnClaim func(pool types.NamespacedName, created time.Time)
	// OnClaimed hears how such a claim was served, once. Claims this manager
	// did not see arrive (running before a restart) are not told. Called
	// without the dispatcher's lock.
	OnClaimed func(pool types.NamespacedName, c Claimed)
	// Admitted reports whether namespace ns may use pool, a pool of another
	// namespace (tenancy: a shared pool whose selector picks ns). Work of a
	// namespace not admitted waits and gets no pod. Nil: none is.
	Admitted func(pool *sandboxv1alpha1.SandboxPool, ns string) bool
	// PodGone hears of each pod deleted from the informer (Usable's memory
	// of it can go). Called without the dispatcher's lock.
	PodGone func(pod *corev1.Pod)
}

// Dispatcher holds the queues of every pool. Its methods are safe for
// concurrent use; the wake-up callbacks run without its lock held.
type Dispatcher struct {
	o     Options
	mu    sync.Mutex
	pools map[types.NamespacedName]*pool
	execs map[types.UID]*entry
}

// New returns an empty Dispatcher that calls o's callbacks (unset: none).
func New(o Options) *Dispatcher {
	return &Dispatcher{o: o, pools: map[types.NamespacedName]*pool{}, execs: map[types.UID]*entry{}}
}

type state int

const (
	waiting  state = iota // in its session's queue or the pool's queue
	assigned              // a pod was chosen; the claim is not seen yet
	running               // claimed a pod (its session is busy until it ends)
)

type entry struct {
	uid  types.UID
	name types.NamespacedName
	// lease: the entry is a Session waiting for its pod, not an Execution.
	lease bool
	pool  *pool
	// session is the key (sessionKey) of the session it runs in or leases for.
	session string
	created time.Time
	// seen is when this dispatcher learned of it (see podInfo.readySeen).
	seen time.Time
	// chosen is when its pod was last chosen; zero before.
	chosen time.Time
	state  state
	pod    string // assigned or running on
	// claim: a new claim of a pool's pod whose outcome is still to be told.
	claim bool
	// awaits, for a Session's lease, is the pod the data plane claimed for
	// its one-call run: it takes no other pod meanwhile (ClaimedPod).
	awaits string
	// index in the pool's queue and in the session's queue, -1 when out.
	poolIdx, sessionIdx int
}

type podInfo struct {
	name        string
	pod         *corev1.Pod // as last seen: judged again when its pool changes
	rv          string
	current     bool      // built from the pool's current template
	idle        bool      // a fresh pod free to claim
	session     string    // sessionKey of the session that holds it
	tenant      string    // the namespace whose code it ran (lease.Tenant)
	sessionUID  types.UID // the Session object that holds it ("" before Session objects)
	sessionFree bool      // a session pod free for the session's next Execution
	claimedBy   types.UID
	assignedTo  *entry
	// heldBy is the run or lease a status says holds the pod, before the
	// pod's own event shows the claim (cleared by that event): it counts for
	// its namespace in a shared pool meanwhile.
	heldBy     *entry
	readySince time.Time // when the pod last became Ready; zero while it is not
	// readySeen is when this dispatcher first saw it Ready: readySince is
	// in whole seconds, too coarse to order it against a claim of the same second.
	readySeen time.Time
}

type session struct {
	name    string
	queue   entryHeap
	pod     string    // the session's live pod, if any
	running types.UID // the Execution (or lease) holding, or about to hold, the session
	// lease is the Session's own entry while it waits for its pod.
	lease *entry
	// ready: the Session object says it holds its pod. Only then do the
	// Session's Executions get the pod: a new leader can learn of a pod
	// labelled with the Session's name, and of its Executions, before it
	// learns that the Session is still adopting that pod.
	ready bool
	// uid is the Session object's: a pod left by an earlier Session of the
	// same name is not this one's.
	uid types.UID
	// named is the pod the Session's status names once it is Ready: the
	// session's only pod from then on. A lease retried while the pod
	// informer lagged can leave a second pod labelled with the Session; its
	// events must not make it the session's pod, or the session's next
	// Execution runs on an interpreter that never had the session's state
	// (found by the chaos suite).
	named string
}

type pool struct {
	key      types.NamespacedName
	hash     string
	obj      *sandboxv1alpha1.SandboxPool // nil until seen, and once deleted
	tenants  map[string]*tenantQueue      // waiting for a fresh pod, by namespace
	waiting  int                          // entries in tenants
	sessions map[string]*session          // by sessionKey
	pods     map[string]*podInfo
	idle     map[string]*podInfo
	// namedBy: pods a Ready Session's status names, by the session's key
	// (sessions.go, renamed).
	namedBy    map[string]string
	lastDemand int
}

// wakes collects the callbacks of one locked section.
type wakes struct {
	execs    []types.NamespacedName
	sessions []types.NamespacedName
	pools    []types.NamespacedName
	claims   []*entry // new entries that claim a pod of their pool
	served   []served // how such claims were served
}

type served struct {
	pool types.NamespacedName
	Claimed
}

// served records how a claim got pod, once.
func (w *wakes) serve(e *entry, pi *podInfo) {
	if !e.claim || pi == nil {
		return
	}
	e.claim = false
	c := Claimed{Namespace: e.name.Namespace, Warm: warm(e, pi), Chosen: !e.chosen.IsZero()}
	if c.Chosen {
		c.Queued = e.chosen.Sub(e.seen)
	}
	w.served = append(w.served, served{e.pool.key, c})
}

// warm reports whether the pod was Ready before the claim was made: by the
// API server's times, which are whole seconds (a pod Ready the second before
// a claim is warm, even if this manager saw it later, after a restart), or,
// within one second, by the order in which this dispatcher saw them.
func warm(e *entry, pi *podInfo) bool {
	switch {
	case pi.readySince.IsZero():
		return false
	case pi.readySince.Before(e.created):
		return true
	case pi.readySince.Equal(e.created):
		return !pi.readySeen.After(e.seen)
	}
	return false
}

func (w *wakes) wake(e *entry) {
	if e.lease {
		w.sessions = append(w.sessions, e.name)
	} else {
		w.execs = append(w.execs, e.name)
	}
}

func (d *Dispatcher) deliver(w wakes) {
	for _, e := range w.execs {
		if d.o.WakeExecution != nil {
			d.o.WakeExecution(e)
		}
	}
	for _, s := range w.sessions {
		if d.o.WakeSession != nil {
			d.o.WakeSession(s)
		}
	}
	for _, p := range w.pools {
		if d.o.WakePool != nil {
			d.o.WakePool(p)
		}
	}
	if d.o.OnClaim != nil {
		for _, e := range w.claims {
			d.o.OnClaim(e.pool.key, e.created)
		}
	}
	if d.o.OnClaimed != nil {
		for _, s := range w.served {
			d.o.OnClaimed(s.pool, s.Claimed)
		}
	}
}

func (d *Dispatcher) pool(key types.NamespacedName) *pool {
	p := d.pools[key]
	if p == nil {
		p = &pool{key: key, sessions: map[string]*session{}, pods: map[string]*podInfo{}, idle: map[string]*podInfo{},
			tenants: map[string]*tenantQueue{}, namedBy: map[string]string{}}
		d.pools[key] = p
	}
	return p
}

// gc drops a pool that holds nothing any more.
func (d *Dispatcher) gc(p *pool) {
	if len(p.pods) == 0 && len(p.sessions) == 0 && len(p.namedBy) == 0 && p.waiting == 0 && p.hash == "" {
		delete(d.pools, p.key)
	}
}
