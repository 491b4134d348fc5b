package dataplane

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
)

// sessionChanges wakes the one-call runs waiting on a Session (and the
// requests and warm-ups waiting for the cache to catch up with a lease)
// whenever the informer delivers a change of it or of its pod's claim: the
// wait for Ready costs the data plane no polling and the caller no watch of
// its own.
type sessionChanges struct {
	mu      sync.Mutex
	waiting map[client.ObjectKey][]chan struct{}
}

// subscribe returns a channel closed at the Session's next change.
func (c *sessionChanges) subscribe(key client.ObjectKey) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting == nil {
		c.waiting = map[client.ObjectKey][]chan struct{}{}
	}
	ch := make(chan struct{})
	c.waiting[key] = append(c.waiting[key], ch)
	return ch
}

// unsubscribe forgets ch, if no change has closed it yet.
func (c *sessionChanges) unsubscribe(key client.ObjectKey, ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.waiting[key]
	for i, w := range list {
		if w == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(c.waiting, key)
		return
	}
	c.waiting[key] = list
}

func (c *sessionChanges) changed(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ses, ok := obj.(*sandboxv1alpha1.Session)
	if !ok {
		return
	}
	c.wake(client.ObjectKeyFromObject(ses))
}

// podChanged wakes those waiting on the Session a pod's claim names: the
// claim is written alongside the Session's Ready status and may reach the
// cache after it.
func (c *sessionChanges) podChanged(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok && lease.Session(pod) != "" {
		c.wake(client.ObjectKey{Namespace: pod.Namespace, Name: lease.Session(pod)})
	}
}

func (c *sessionChanges) wake(key client.ObjectKey) {
	c.mu.Lock()
	list := c.waiting[key]
	delete(c.waiting, key)
	c.mu.Unlock()
	for _, ch := range list {
		close(ch)
	}
}

// handler is the informer's event handler.
func (c *sessionChanges) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.changed(obj) },
		UpdateFunc: func(_, obj any) { c.changed(obj) },
		DeleteFunc: c.changed,
	}
}

// podHandler is the pod informer's event handler.
func (c *sessionChanges) podHandler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podChanged(obj) },
		UpdateFunc: func(_, obj any) { c.podChanged(obj) },
		DeleteFunc: c.podChanged,
	}
}
