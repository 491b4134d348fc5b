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
	"container/heap"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
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

// Dispatcher holds the queues of every pool. Its methods are safe for
// concurrent use; the wake-up callbacks run without its lock held.
type Dispatcher struct {
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

	mu    sync.Mutex
	pools map[types.NamespacedName]*pool
	execs map[types.UID]*entry
}

// New returns an empty Dispatcher.
func New(wakeExecution, wakePool func(types.NamespacedName)) *Dispatcher {
	return &Dispatcher{WakeExecution: wakeExecution, WakePool: wakePool,
		pools: map[types.NamespacedName]*pool{}, execs: map[types.UID]*entry{}}
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
	key        types.NamespacedName
	hash       string
	obj        *sandboxv1alpha1.SandboxPool // nil until seen, and once deleted
	tenants    map[string]*tenantQueue      // waiting for a fresh pod, by namespace
	waiting    int                          // entries in tenants
	sessions   map[string]*session          // by sessionKey
	pods       map[string]*podInfo
	idle       map[string]*podInfo
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
		if d.WakeExecution != nil {
			d.WakeExecution(e)
		}
	}
	for _, s := range w.sessions {
		if d.WakeSession != nil {
			d.WakeSession(s)
		}
	}
	for _, p := range w.pools {
		if d.WakePool != nil {
			d.WakePool(p)
		}
	}
	if d.OnClaim != nil {
		for _, e := range w.claims {
			d.OnClaim(e.pool.key, e.created)
		}
	}
	if d.OnClaimed != nil {
		for _, s := range w.served {
			d.OnClaimed(s.pool, s.Claimed)
		}
	}
}

func (d *Dispatcher) pool(key types.NamespacedName) *pool {
	p := d.pools[key]
	if p == nil {
		p = &pool{key: key, sessions: map[string]*session{}, pods: map[string]*podInfo{}, idle: map[string]*podInfo{},
			tenants: map[string]*tenantQueue{}}
		d.pools[key] = p
	}
	return p
}

// gc drops a pool that holds nothing any more.
func (d *Dispatcher) gc(p *pool) {
	if len(p.pods) == 0 && len(p.sessions) == 0 && p.waiting == 0 && p.hash == "" {
		delete(d.pools, p.key)
	}
}

// sessionKey tells apart the sessions of different namespaces in a shared pool.
func sessionKey(ns, name string) string { return ns + "/" + name }

func (p *pool) session(name string) *session {
	s := p.sessions[name]
	if s == nil {
		s = &session{name: name}
		p.sessions[name] = s
	}
	return s
}

// owns reports whether a pod labelled with the session's name is the current
// Session object's (or from before Session objects recorded their UID).
func (s *session) owns(pi *podInfo) bool {
	return (pi.sessionUID == "" || s.uid == "" || pi.sessionUID == s.uid) && (s.named == "" || pi.name == s.named)
}

func (p *pool) gcSession(s *session) {
	if s.queue.Len() == 0 && s.pod == "" && s.running == "" && s.lease == nil && !s.ready {
		delete(p.sessions, s.name)
	}
}

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
		// Waiting again: its claim, written with its Running status, did not
		// commit, and Running was taken back. The pod's own events say whether
		// it is free.
		d.requeue(e, &w)
	}
	return w
}

// UpdateSession takes in a Session as the informer (or a reconcile) saw it. A
// Session that holds no pod waits for one: a fresh pod from its pool's queue,
// or the pod already labelled with its name (left by a manager that stopped
// between the claim and the status), which it adopts when no run holds it.
func (d *Dispatcher) UpdateSession(ses *sandboxv1alpha1.Session) {
	d.mu.Lock()
	w := d.updateSession(ses)
	d.mu.Unlock()
	d.deliver(w)
}

func (d *Dispatcher) updateSession(ses *sandboxv1alpha1.Session) wakes {
	var w wakes
	e := d.execs[ses.UID]
	p := d.pool(ses.PoolKey())
	key := sessionKey(ses.Namespace, ses.Name)
	ready := ses.Status.Phase == sandboxv1alpha1.SessionReady && ses.DeletionTimestamp == nil
	if s := p.sessions[key]; s != nil || ready {
		s = p.session(key)
		if s.ready != ready || s.uid != ses.UID || s.named != ses.Status.PodName {
			s.ready, s.uid, s.named = ready, ses.UID, ses.Status.PodName
			if pi := p.pods[s.named]; pi != nil && pi.session == key && s.owns(pi) {
				s.pod = s.named
			} else if s.named != "" && s.pod != s.named {
				s.pod = "" // its pod's own event sets it
			}
			d.syncSession(p, s, &w)
			p.gcSession(s)
		}
	}
	switch {
	case ses.Status.PodName != "" || ses.Status.Phase.IsFinished() || ses.DeletionTimestamp != nil || ses.Spec.Close ||
		// Suspended, it waits for nothing until a run asks for it.
		(ses.Status.Phase == sandboxv1alpha1.SessionSuspended && !ses.ResumeRequested()):
		if e != nil {
			if pi := p.pods[ses.Status.PodName]; pi != nil {
				w.serve(e, pi)
				if pi.assignedTo == e {
					pi.assignedTo = nil
				}
				if ready && pi.session == "" && pi.claimedBy == "" {
					p.hold(pi, e) // leased, though its pod's event has not shown it yet
				}
			}
			d.remove(e, &w)
		}
	case e == nil:
		e = &entry{uid: ses.UID, name: types.NamespacedName{Namespace: ses.Namespace, Name: ses.Name}, lease: true,
			pool: p, session: key, created: ses.CreationTimestamp.Time, seen: time.Now(), poolIdx: -1, sessionIdx: -1}
		d.execs[ses.UID] = e
		p.session(key).uid = ses.UID
		e.claim = true
		w.claims = append(w.claims, e)
		d.enqueue(e, &w)
	}
	return w
}

// DeleteSession forgets a Session that was deleted: as a Session being
// deleted, it holds no lease and its Executions get no pod.
func (d *Dispatcher) DeleteSession(ses *sandboxv1alpha1.Session) {
	gone := ses.DeepCopy()
	if gone.DeletionTimestamp == nil {
		now := metav1.Now()
		gone.DeletionTimestamp = &now
	}
	d.UpdateSession(gone)
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

// markRunning records that e claimed pod (a status or a claim seen).
func (d *Dispatcher) markRunning(e *entry, pod string, w *wakes) {
	if e.state == running && e.pod == pod {
		return
	}
	p := e.pool
	d.unqueue(e)
	if e.state == assigned && e.pod != pod {
		d.unassignPod(p, e)
	}
	w.serve(e, p.pods[pod])
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

// UpdatePod takes in a sandbox pod as the informer saw it.
func (d *Dispatcher) UpdatePod(pod *corev1.Pod) {
	poolName := pod.Labels[sandboxpod.LabelPool]
	if poolName == "" {
		return
	}
	d.mu.Lock()
	var w wakes
	p := d.pool(types.NamespacedName{Namespace: pod.Namespace, Name: poolName})
	if pod.DeletionTimestamp != nil || sandboxpod.IsTerminal(pod) {
		d.deletePod(p, pod.Name, &w)
	} else {
		d.updatePod(p, pod, &w)
	}
	d.mu.Unlock()
	d.deliver(w)
}

// Recheck looks again at a pod it holds, as it last saw it: what Usable
// says of it changed outside the informer (its agent answered).
func (d *Dispatcher) Recheck(pod *corev1.Pod) {
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}
	d.mu.Lock()
	var w wakes
	if p := d.pools[key]; p != nil {
		if pi := p.pods[pod.Name]; pi != nil && pi.pod != nil && pi.pod.UID == pod.UID {
			d.updatePod(p, pi.pod, &w)
		}
	}
	d.mu.Unlock()
	d.deliver(w)
}

// DeletePod forgets a pod that was deleted.
func (d *Dispatcher) DeletePod(pod *corev1.Pod) {
	poolName := pod.Labels[sandboxpod.LabelPool]
	if poolName == "" {
		return
	}
	d.mu.Lock()
	var w wakes
	if p := d.pools[types.NamespacedName{Namespace: pod.Namespace, Name: poolName}]; p != nil {
		d.deletePod(p, pod.Name, &w)
		d.gc(p)
	}
	d.mu.Unlock()
	if d.PodGone != nil {
		d.PodGone(pod)
	}
	d.deliver(w)
}

func (d *Dispatcher) updatePod(p *pool, pod *corev1.Pod, w *wakes) {
	pi := p.pods[pod.Name]
	if pi == nil {
		pi = &podInfo{name: pod.Name}
		p.pods[pod.Name] = pi
	}
	oldSession := pi.session
	pi.pod = pod
	pi.rv = pod.ResourceVersion
	pi.current = p.hash == "" || pod.Labels[sandboxpod.LabelTemplateHash] == p.hash
	pi.claimedBy = lease.ClaimedBy(pod)
	pi.heldBy = nil
	pi.tenant = lease.Tenant(pod)
	pi.session = ""
	if name := lease.Session(pod); name != "" {
		pi.session = sessionKey(pi.tenant, name)
	}
	pi.sessionUID = lease.SessionUID(pod)
	usable := d.Usable == nil || (p.obj != nil && d.Usable(p.obj, pod))
	pi.idle = pi.session == "" && pi.claimedBy == "" && sandboxpod.IsIdle(pod) && usable
	pi.sessionFree = pi.session != "" && pi.claimedBy == "" && sandboxpod.IsReady(pod) && usable
	pi.readySince = time.Time{}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			pi.readySince = c.LastTransitionTime.Time
		}
	}
	switch {
	case pi.readySince.IsZero():
		pi.readySeen = time.Time{}
	case pi.readySeen.IsZero():
		pi.readySeen = time.Now()
	}
	if pi.idle && pi.assignedTo == nil {
		p.idle[pi.name] = pi
	} else {
		delete(p.idle, pi.name)
	}
	// A pod chosen for one Execution that someone else took (or that stopped
	// being free) sends that Execution back to its place in the queue.
	if a := pi.assignedTo; a != nil && !pi.idle && !(a.session != "" && pi.sessionFree && pi.session == a.session) {
		pi.assignedTo = nil
		if pi.claimedBy != a.uid {
			d.requeue(a, w)
		}
	}
	if e := d.execs[pi.claimedBy]; e != nil && pi.claimedBy != "" && usable {
		// The claim is seen before the Execution's status. Only on a pod the
		// pool may lease: anyone who may create pods can write a waiting
		// Execution's claim on one, which must not take it out of the queue.
		d.markRunning(e, pi.name, w)
	}
	if oldSession != "" && oldSession != pi.session {
		d.dropSessionPod(p, oldSession, pi.name, w)
	}
	if pi.session != "" && p.session(pi.session).owns(pi) {
		s := p.session(pi.session)
		s.pod = pi.name
		if pi.claimedBy == "" && s.running != "" {
			if e := d.execs[s.running]; e == nil || (e.state == running && e.pod == pi.name) {
				s.running = "" // released after the Execution ended
			}
		}
		d.syncSession(p, s, w)
	}
	d.fill(p, w)
}

func (d *Dispatcher) deletePod(p *pool, name string, w *wakes) {
	pi := p.pods[name]
	if pi == nil {
		return
	}
	delete(p.pods, name)
	delete(p.idle, name)
	if a := pi.assignedTo; a != nil {
		d.requeue(a, w)
	}
	if pi.session != "" {
		d.dropSessionPod(p, pi.session, name, w)
	}
	d.fill(p, w)
}

func (d *Dispatcher) dropSessionPod(p *pool, name, pod string, w *wakes) {
	s := p.sessions[name]
	if s == nil || s.pod != pod {
		return
	}
	s.pod = ""
	d.syncSession(p, s, w)
	p.gcSession(s)
}

// UpdatePool takes in a pool (its template decides which pods are current).
func (d *Dispatcher) UpdatePool(obj *sandboxv1alpha1.SandboxPool) {
	d.mu.Lock()
	var w wakes
	p := d.pool(types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name})
	old := p.obj
	if obj.DeletionTimestamp != nil {
		p.hash, p.obj = "", nil
	} else {
		p.hash, p.obj = sandboxpod.TemplateHash(obj), obj
	}
	// Which pods are current and which may be leased depend on the pool's
	// spec (and UID): judge them again when that changes.
	if old == nil || p.obj == nil || old.UID != p.obj.UID || old.Generation != p.obj.Generation {
		for _, pi := range p.pods {
			if pi.pod != nil {
				d.updatePod(p, pi.pod, &w)
			}
		}
	}
	d.mu.Unlock()
	d.deliver(w)
}

// DeletePool forgets a pool's template; its Executions stay queued (they
// report that the pool is missing) and its pods go with their own events.
func (d *Dispatcher) DeletePool(key types.NamespacedName) {
	d.mu.Lock()
	var w wakes
	if p := d.pools[key]; p != nil {
		p.hash, p.obj = "", nil
		for _, pi := range p.pods {
			if pi.pod != nil {
				d.updatePod(p, pi.pod, &w)
			}
		}
		d.gc(p)
	}
	d.mu.Unlock()
	d.deliver(w)
}

// syncSession keeps a session's lease in the pool's queue while the session
// has no pod, and gives the session's pod, when free, to the lease (adopting
// it) or else to the session's oldest waiting Execution.
func (d *Dispatcher) syncSession(p *pool, s *session, w *wakes) {
	pi := p.pods[s.pod]
	if pi != nil && !s.owns(pi) {
		pi = nil
	}
	if l := s.lease; l != nil && l.state == waiting {
		switch {
		case pi != nil && l.poolIdx >= 0:
			p.unpush(l)
		case pi == nil && l.poolIdx < 0:
			p.push(l)
		}
	}
	if s.running != "" || pi == nil || !pi.sessionFree || pi.assignedTo != nil {
		return
	}
	next := s.lease
	if next == nil || next.state != waiting {
		if next = s.queue.peek(); next == nil || !s.ready {
			return
		}
		heap.Remove(&s.queue, next.sessionIdx)
	}
	d.assign(p, next, pi, w)
	s.running = next.uid
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
	return d.place(ex.UID, func() wakes { return d.updateExecution(ex) })
}

// PlaceSession is Place for a Session that waits for its pod.
func (d *Dispatcher) PlaceSession(ses *sandboxv1alpha1.Session) Placement {
	return d.place(ses.UID, func() wakes { return d.updateSession(ses) })
}

func (d *Dispatcher) place(uid types.UID, takeIn func() wakes) Placement {
	d.mu.Lock()
	var w wakes
	e := d.execs[uid]
	if e == nil {
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
// benchmark).
func (d *Dispatcher) Promised(key types.NamespacedName) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[key]
	if p == nil {
		return nil
	}
	var out map[string]bool
	for name, pi := range p.pods {
		if pi.idle && pi.assignedTo != nil {
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
