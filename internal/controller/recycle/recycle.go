// Package recycle gives a pod released for reuse a fresh interpreter and
// returns it to its pool's idle pods.
package recycle

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/runner"
)

// ResetTimeout bounds an interpreter reset; the pool controller deletes pods
// that stay resetting longer (the manager stopped during the reset).
const ResetTimeout = time.Minute

// Pod gives a pod released for reuse a fresh interpreter and returns
// it to the pool's idle pods, or deletes it when the reset fails. Executions
// and Sessions both end this way under reusePolicy FreshInterpreter.
func Pod(log logr.Logger, c client.Client, reader client.Reader, rn *runner.Runner,
	key client.ObjectKey, addr string, podUID types.UID, keyID string) {
	ctx, cancel := context.WithTimeout(context.Background(), ResetTimeout)
	defer cancel()
	resetErr := rn.Reset(ctx, addr, podUID, keyID)
	pod := &corev1.Pod{}
	if err := reader.Get(ctx, key, pod); err != nil || pod.UID != podUID {
		return // gone; nothing to return
	}
	if resetErr != nil {
		log.Info("could not reset the interpreter for reuse; deleting the pod", "err", resetErr.Error())
		if err := c.Delete(ctx, pod, client.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}); client.IgnoreNotFound(err) != nil {
			log.Error(err, "delete pod after a failed reset")
		}
		return
	}
	if err := RetryPodUpdate(ctx, reader, pod, func(p *corev1.Pod) error { return lease.ReturnToPool(ctx, c, p) }); err != nil {
		log.Error(err, "return reset pod to its pool")
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
