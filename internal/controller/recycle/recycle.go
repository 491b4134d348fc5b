// Package recycle gives a pod released for reuse a fresh interpreter and
// returns it to its pool's idle pods.
package recycle

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// ResetTimeout bounds an interpreter reset; the pool controller deletes pods
// that stay resetting longer (the manager stopped during the reset).
const ResetTimeout = time.Minute

// Pod gives a pod released for reuse a fresh interpreter and returns
// it to the pool's idle pods, or deletes it when the reset fails. Sessions
// end this way under reusePolicy FreshInterpreter. The pod is the one with
// podUID, released for its reset: the gate refuses any other (one made under
// its name meanwhile is never called, nor deleted).
func Pod(log logr.Logger, c client.Client, reader client.Reader, gate *agentgate.Gate, key client.ObjectKey, podUID types.UID) {
	// A pod whose return failed stays resetting, and its pool deletes it
	// after ResetTimeout: nothing to retry here.
	_ = recycle(log, c, reader, gate, key, agentgate.ForReset(podUID), func(p *corev1.Pod) bool {
		_, resetting := lease.ResetSince(p) // the cache may not show the release yet
		return p.UID == podUID && resetting
	},
		func(ctx context.Context, p *corev1.Pod) error { return lease.ReturnToPool(ctx, c, p) })
}

// Claimed gives a pod its Execution ended on a fresh interpreter while the
// Execution's claim still holds it, and then returns it to its pool's idle
// pods in one write (lease.ReleaseReset); it deletes the pod when the reset
// fails. The final status is stored before: the reset is what follows it.
// A manager that stops meanwhile leaves the claim, and the Execution's next
// reconcile starts over. done: nothing is left to do (the pod is returned,
// deleted, gone or not the Execution's); not done, a write failed (an API
// server restarting) and the pod still carries the claim: the caller tries
// again, as nothing else frees a pod claimed by a finished Execution.
func Claimed(log logr.Logger, c client.Client, reader client.Reader, gate *agentgate.Gate, ex *sandboxv1alpha1.Execution) (done bool) {
	return recycle(log, c, reader, gate, ex.PodKey(), agentgate.ForExecution(ex),
		func(p *corev1.Pod) bool { return p.UID == ex.Status.PodUID && lease.ClaimedBy(p) == ex.UID },
		func(ctx context.Context, p *corev1.Pod) error { return lease.ReleaseReset(ctx, c, p, ex) })
}

// recycle resets the interpreter of the pod at key, opened for holder, as
// long as ours says the pod is still the one to reset, then releases it;
// a pod whose reset failed is deleted. done: false when the release or the
// delete failed.
func recycle(log logr.Logger, c client.Client, reader client.Reader, gate *agentgate.Gate, key client.ObjectKey, holder agentgate.Holder,
	ours func(*corev1.Pod) bool, release func(context.Context, *corev1.Pod) error) (done bool) {
	ctx, cancel := context.WithTimeout(context.Background(), ResetTimeout)
	defer cancel()
	pod := &corev1.Pod{}
	if !current(ctx, c, reader, key, pod, ours) {
		return true // gone, or not to reset any more
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}, pool); err != nil {
		pool = nil // the gate refuses: a pod without its pool is deleted
	}
	agent, resetErr := gate.Open(ctx, pool, pod, holder)
	if agentgate.IsRefused(resetErr) && (pool == nil || !lease.Owned(pod, pool)) {
		log.Info("not resetting a pod its pool does not own", "err", resetErr.Error())
		return true
	}
	if resetErr == nil {
		resetErr = reset(ctx, agent)
	}
	if !current(ctx, c, reader, key, pod, ours) {
		return true // gone; nothing to return
	}
	if resetErr != nil {
		log.Info("could not reset the interpreter for reuse; deleting the pod", "err", resetErr.Error())
		if err := c.Delete(ctx, pod, client.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}); client.IgnoreNotFound(err) != nil {
			log.Error(err, "delete pod after a failed reset")
			return false
		}
		return true
	}
	// The interpreter is fresh: a release the API server does not take (it
	// restarts) is sent again, not the reset, until ResetTimeout. A release
	// that landed but whose answer was lost conflicts next time, and the pod
	// read again is no longer ours to release (release does nothing).
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := RetryPodUpdate(ctx, reader, pod, func(p *corev1.Pod) error { return release(ctx, p) })
		if err == nil || apierrors.IsNotFound(err) {
			return true
		}
		log.Info("return reset pod to its pool: trying again", "err", err.Error(), "in", wait)
		select {
		case <-ctx.Done():
			log.Error(err, "return reset pod to its pool")
			return false
		case <-time.After(wait):
		}
	}
}

// current reads the pod at key into pod and reports whether ours says it
// is the one to reset: from c's cache first, and around it when the cache
// does not say so (it may lag behind the write that released the pod).
// The writes that follow carry the pod's resourceVersion.
func current(ctx context.Context, c, reader client.Reader, key client.ObjectKey, pod *corev1.Pod, ours func(*corev1.Pod) bool) bool {
	if err := c.Get(ctx, key, pod); err == nil && ours(pod) {
		return true
	}
	return reader.Get(ctx, key, pod) == nil && ours(pod)
}

// reset gives the agent a fresh interpreter. The agent publishes a run's
// result a moment before it frees the interpreter, so a reset that follows
// the result at once can find it busy (409): that is retried for a few seconds.
func reset(ctx context.Context, agent *agentgate.Agent) error {
	for wait := 20 * time.Millisecond; ; wait *= 2 {
		err := agent.ResetForReuse(ctx)
		if !agentgate.IsStatus(err, http.StatusConflict) || wait > 2*time.Second {
			if err != nil {
				metrics.AgentErrors.WithLabelValues("reset").Inc()
			}
			return err
		}
		select {
		case <-ctx.Done():
			metrics.AgentErrors.WithLabelValues("reset").Inc()
			return err
		case <-time.After(wait):
		}
	}
}

// RetryPodUpdate applies a pod update, re-reading the pod (around the cache)
// when it changed since it was read. Other errors are returned as they are.
func RetryPodUpdate(ctx context.Context, reader client.Reader, pod *corev1.Pod, update func(*corev1.Pod) error) error {
	p := pod.DeepCopy()
	for i := 0; ; i++ {
		err := update(p)
		if err == nil || !apierrors.IsConflict(err) || i == 3 {
			return err
		}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
}
