package dispatch

import (
	"container/heap"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

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
			was := s.heldName()
			s.ready, s.uid, s.named = ready, ses.UID, ses.Status.PodName
			d.renamed(p, key, was, s.heldName(), &w)
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
			pool: p, session: key, created: ses.CreationTimestamp.Time, seen: time.Now(), poolIdx: -1, sessionIdx: -1,
			awaits: ClaimedPod(ses, time.Now())}
		d.execs[ses.UID] = e
		p.session(key).uid = ses.UID
		e.claim = true
		w.claims = append(w.claims, e)
		d.enqueue(e, &w)
	case e.lease && e.state == waiting && e.awaits != ClaimedPod(ses, time.Now()):
		// The data plane's claim failed (it took the annotation back), or
		// its grace is over: the Session waits for any pod of the pool.
		e.awaits = ClaimedPod(ses, time.Now())
		d.syncSession(p, p.session(key), &w)
		d.fill(p, &w)
	}
	return w
}

// ClaimedPodGrace is how long a one-call run's Session waits for the pod the
// data plane claimed for it (sandboxv1alpha1.AnnotationClaimedPod) before it
// takes any pod of its pool: the claim is written at the same time as the
// Session, and lands within moments, or fails and the annotation goes.
const ClaimedPodGrace = 10 * time.Second

// ClaimedPod is the pod the data plane claimed for ses's run, which ses
// waits for alone while the grace lasts ("" once it is over, or for none).
func ClaimedPod(ses *sandboxv1alpha1.Session, now time.Time) string {
	pod := ses.Annotations[sandboxv1alpha1.AnnotationClaimedPod]
	if pod == "" || ses.Status.PodName != "" || !now.Before(ses.CreationTimestamp.Add(ClaimedPodGrace)) {
		return ""
	}
	return pod
}

// heldName is the pod the Session's Ready status names, "" when it is not Ready.
func (s *session) heldName() string {
	if !s.ready {
		return ""
	}
	return s.named
}

// renamed moves the mark of the pod a Ready Session's status names, from was
// to now. The lease's claim is written alongside the Ready status, not before
// it (internal/controller/session/lease.go): until the claim shows on the pod,
// or if the manager stopped before it landed, the pod's own events say it is
// idle. The mark keeps it out of every other claim meanwhile; the Session
// controller writes the claim again if it never landed.
func (d *Dispatcher) renamed(p *pool, key, was, now string, w *wakes) {
	if was == now {
		return
	}
	if was != "" && p.namedBy[was] == key {
		delete(p.namedBy, was)
		if pi := p.pods[was]; pi != nil && pi.pod != nil {
			d.updatePod(p, pi.pod, w)
		}
	}
	if now != "" {
		p.namedBy[now] = key
		if pi := p.pods[now]; pi != nil && pi.pod != nil {
			d.updatePod(p, pi.pod, w)
		}
	}
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

func (d *Dispatcher) dropSessionPod(p *pool, name, pod string, w *wakes) {
	s := p.sessions[name]
	if s == nil || s.pod != pod {
		return
	}
	s.pod = ""
	d.syncSession(p, s, w)
	p.gcSession(s)
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
		case pi == nil && l.poolIdx < 0 && l.awaits == "":
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
