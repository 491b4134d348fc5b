package dispatch

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

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
	if d.o.PodGone != nil {
		d.o.PodGone(pod)
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
	pi.tenant = lease.Tenant(pod)
	pi.session = ""
	if name := lease.Session(pod); name != "" {
		pi.session = sessionKey(pi.tenant, name)
	}
	// A Running status names the pod and its claim is not seen yet: the pod
	// stays the run's whatever else its events say (a restart's informers
	// deliver the pod and the Execution in any order), until the claim shows
	// or the run goes back to the queue (unhold).
	if h := pi.heldBy; h == nil || pi.claimedBy != "" || pi.session != "" || h.state != running || h.pod != pi.name || d.execs[h.uid] != h {
		pi.heldBy = nil
	}
	pi.sessionUID = lease.SessionUID(pod)
	usable := d.o.Usable == nil || (p.obj != nil && d.o.Usable(p.obj, pod))
	named := p.namedBy[pi.name]
	// Named by a Ready Session whose claim is not seen yet: that Session's.
	pi.idle = pi.session == "" && pi.claimedBy == "" && named == "" && pi.heldBy == nil && sandboxpod.IsIdle(pod) && usable &&
		(d.o.Placeable == nil || d.o.Placeable(p.obj, pod))
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
	if a := pi.assignedTo; a != nil && !pi.idle && !(a.session != "" && (pi.sessionFree && pi.session == a.session || named == a.session)) {
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
