package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The session policy: the Executions of a session run one at a time, in
// creation order, on one pod whose interpreter keeps its state. A session is
// named within its pool (two pools may each have a session "s"). When the
// session's pod is gone, its state is gone: the session's later Executions
// fail SessionLost instead of silently running on a fresh interpreter.

// sessionKey is the value of indexSession: a session is named within its pool.
func sessionKey(pool, session string) string { return pool + "/" + session }

// sessionLost returns the pod an earlier Execution of ex's session ran on
// when the session has no live pod any more; "" for a session that never had
// one (ex is its first Execution). It is called only when the dispatcher saw
// no pod for the session, and reads the pods around the cache before saying
// "lost". The pod informer can lag behind the Execution informer (and a new
// leader's dispatcher can learn of Executions before pods): a live pod found
// that way is returned, and the session must wait for it, never take a second pod.
func (r *ExecutionReconciler) sessionLost(ctx context.Context, ex *sandboxv1alpha1.Execution) (lost string, live *corev1.Pod, err error) {
	var history sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &history, client.InNamespace(ex.Namespace),
		client.MatchingFields{indexSession: sessionKey(ex.Spec.PoolRef.Name, ex.Spec.Session)}); err != nil {
		return "", nil, fmt.Errorf("list executions of session %s: %w", ex.Spec.Session, err)
	}
	for i := range history.Items {
		if o := &history.Items[i]; o.UID != ex.UID && o.Status.PodName != "" {
			lost = o.Status.PodName
			break
		}
	}
	if lost == "" {
		return "", nil, nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(ex.Namespace), client.MatchingLabels{
		sandboxpod.LabelPool: ex.Spec.PoolRef.Name, sandboxpod.LabelSession: ex.Spec.Session}); err != nil {
		return "", nil, fmt.Errorf("list pods of session %s: %w", ex.Spec.Session, err)
	}
	for i := range pods.Items {
		if !sandboxpod.IsTerminal(&pods.Items[i]) {
			return "", &pods.Items[i], nil
		}
	}
	return lost, nil, nil
}

// sessionPredecessors returns the unfinished Executions of ex's session that
// must run before it: one that holds (or claimed) a pod, or an older waiting
// one. The dispatcher orders a session's Executions, but it learns of them
// through its own event handler, which can lag behind the reconcile's cache
// (and a new leader's first list is in name order, not creation order); the
// cache holds every Execution created before ex, so this check is the guarantee.
func (r *ExecutionReconciler) sessionPredecessors(ctx context.Context, ex *sandboxv1alpha1.Execution) ([]*sandboxv1alpha1.Execution, error) {
	var list sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &list, client.InNamespace(ex.Namespace),
		client.MatchingFields{indexActiveSession: sessionKey(ex.Spec.PoolRef.Name, ex.Spec.Session)}); err != nil {
		return nil, fmt.Errorf("list executions of session %s: %w", ex.Spec.Session, err)
	}
	var out []*sandboxv1alpha1.Execution
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == ex.UID {
			continue
		}
		if o.Status.PodName != "" || (dispatch.IsWaiting(o) && dispatch.Before(o, ex)) {
			out = append(out, o)
		}
	}
	return out, nil
}

// claimedPod returns the live (not ending) pod claimed by the Execution with this UID.
func (r *ExecutionReconciler) claimedPod(ctx context.Context, namespace string, uid types.UID) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingFields{indexClaimedUID: string(uid)}); err != nil {
		return nil, fmt.Errorf("list the pod claimed by %s: %w", uid, err)
	}
	for i := range pods.Items {
		if !sandboxpod.IsTerminal(&pods.Items[i]) {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}
