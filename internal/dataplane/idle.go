package dataplane

import (
	"math/rand/v2"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// idlePods is this replica's view of each pool's idle pods, fed by the pod
// informer's events: a one-call run takes one from it (run.go, claimRun)
// without a list of the pool's pods. It is a hint: the claim, with the
// pod's resourceVersion as precondition, is what decides, and a pod the
// manager or another replica claimed first fails it.
type idlePods struct {
	mu    sync.Mutex
	pools map[types.NamespacedName]map[string]*corev1.Pod
}

// take removes and returns an idle pod of pool that may run namespace ns's
// code (never ran another's) on a node the pool may use (placeable), chosen at random: the manager hands out the
// lowest name first, and two replicas choosing at once should not collide.
func (x *idlePods) take(pool types.NamespacedName, ns string, placeable func(*corev1.Pod) bool) *corev1.Pod {
	x.mu.Lock()
	defer x.mu.Unlock()
	var fit []string
	for name, p := range x.pools[pool] {
		if lease.ServesTenant(p, ns) && placeable(p) {
			fit = append(fit, name)
		}
	}
	if len(fit) == 0 {
		return nil
	}
	name := fit[rand.IntN(len(fit))]
	p := x.pools[pool][name]
	delete(x.pools[pool], name)
	return p.DeepCopy()
}

func (x *idlePods) update(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[sandboxpod.LabelPool] == "" {
		return
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}
	idle := pod.DeletionTimestamp == nil && sandboxpod.IsIdle(pod) && lease.Session(pod) == "" && lease.ClaimedBy(pod) == ""
	x.mu.Lock()
	defer x.mu.Unlock()
	if !idle {
		delete(x.pools[key], pod.Name)
		return
	}
	if x.pools == nil {
		x.pools = map[types.NamespacedName]map[string]*corev1.Pod{}
	}
	if x.pools[key] == nil {
		x.pools[key] = map[string]*corev1.Pod{}
	}
	x.pools[key][pod.Name] = pod
}

func (x *idlePods) remove(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		x.mu.Lock()
		defer x.mu.Unlock()
		delete(x.pools[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}], pod.Name)
	}
}

// handler is the pod informer's event handler.
func (x *idlePods) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { x.update(obj) },
		UpdateFunc: func(_, obj any) { x.update(obj) },
		DeleteFunc: x.remove,
	}
}
