// Package claim hands sandbox pods to Executions. A claim is written on the
// pod itself (a label and annotations) with an update that carries the pod's
// resourceVersion, so the API server refuses the second of two concurrent
// claims: two workers or two managers can never hand one pod to two Executions,
// and a restarted manager rebuilds every claim from the pods.
package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// ErrNotClaimable is returned for a pod that is not free for this Execution.
var ErrNotClaimable = errors.New("pod is not free for this execution")

// ClaimedBy returns the UID of the Execution running on the pod, if any.
func ClaimedBy(pod *corev1.Pod) types.UID {
	return types.UID(pod.Annotations[sandboxpod.AnnotationClaimedUID])
}

// Session returns the session that holds the pod, if any.
func Session(pod *corev1.Pod) string { return pod.Labels[sandboxpod.LabelSession] }

// Tenant returns the namespace whose code the pod ran: its tenant label, or
// for a used pod without one (claimed before shared pools) its own
// namespace; "" for a pod that never ran code, which any namespace the pool
// admits may take.
func Tenant(pod *corev1.Pod) string {
	if t := pod.Labels[sandboxpod.LabelTenant]; t != "" {
		return t
	}
	if pod.Annotations[sandboxpod.AnnotationUsed] != "" || Session(pod) != "" || ClaimedBy(pod) != "" {
		return pod.Namespace
	}
	return ""
}

// ServesTenant reports whether pod may run code of namespace ns: it never
// ran any, or only ns's. A pod never runs two namespaces' code.
func ServesTenant(pod *corev1.Pod, ns string) bool {
	t := Tenant(pod)
	return t == "" || t == ns
}

// markTenant records on pod the namespace whose code it is about to run.
func markTenant(pod *corev1.Pod, ns string) {
	pod.Labels[sandboxpod.LabelTenant] = ns
}

// Claimable reports whether ex may take pod (as read): an idle fresh pod, or its own
// session's pod while no other Execution runs on it.
func Claimable(pod *corev1.Pod, ex *sandboxv1alpha1.Execution) bool {
	if sandboxpod.IsTerminal(pod) || !sandboxpod.IsReady(pod) || !ServesTenant(pod, ex.Namespace) {
		return false
	}
	if s := Session(pod); s != "" {
		return s == ex.Spec.Session && ClaimedBy(pod) == "" && !Suspending(pod)
	}
	return sandboxpod.IsIdle(pod) && ClaimedBy(pod) == ""
}

// Claim marks pod as running ex. It fails with a Conflict error when the pod
// changed since it was read (someone else claimed it first), and with
// ErrNotClaimable when it is not free. On success pod holds the updated object.
func Claim(ctx context.Context, c client.Client, pod *corev1.Pod, ex *sandboxv1alpha1.Execution) error {
	if !Claimable(pod, ex) {
		return ErrNotClaimable
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	markTenant(pod, ex.Namespace)
	if ex.Spec.Session != "" {
		pod.Labels[sandboxpod.LabelSession] = ex.Spec.Session
	}
	pod.Annotations[sandboxpod.AnnotationClaimedBy] = ex.Name
	pod.Annotations[sandboxpod.AnnotationClaimedUID] = string(ex.UID)
	pod.Annotations[sandboxpod.AnnotationUsed] = "true"
	// Update (not a merge patch) sends metadata.resourceVersion: the optimistic lock.
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("claim pod %s for execution %s: %w", pod.Name, ex.Name, err)
	}
	return nil
}

// ReleaseToSession frees a session's pod for the session's next Execution and
// records when it was last used, for the session idle timeout.
func ReleaseToSession(ctx context.Context, c client.Client, pod *corev1.Pod, ex *sandboxv1alpha1.Execution, now time.Time) error {
	if ClaimedBy(pod) != ex.UID {
		return nil // already released, or never ours
	}
	delete(pod.Annotations, sandboxpod.AnnotationClaimedBy)
	delete(pod.Annotations, sandboxpod.AnnotationClaimedUID)
	pod.Annotations[sandboxpod.AnnotationLastUsed] = now.UTC().Format(time.RFC3339Nano)
	if ex.Status.Interpreter != "" {
		pod.Annotations[sandboxpod.AnnotationInterpreter] = ex.Status.Interpreter
	}
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("release pod %s to session %s: %w", pod.Name, ex.Spec.Session, err)
	}
	return nil
}

// ReleaseForReset frees a pod whose Execution ended into StateResetting
// (reusePolicy FreshInterpreter): no Execution holds it, none can claim it, and
// the Execution's result can be written before the interpreter is replaced.
func ReleaseForReset(ctx context.Context, c client.Client, pod *corev1.Pod, ex *sandboxv1alpha1.Execution, now time.Time) error {
	if ClaimedBy(pod) != ex.UID {
		return nil
	}
	delete(pod.Annotations, sandboxpod.AnnotationClaimedBy)
	delete(pod.Annotations, sandboxpod.AnnotationClaimedUID)
	delete(pod.Labels, sandboxpod.LabelSession)
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateResetting
	pod.Annotations[sandboxpod.AnnotationResetSince] = now.UTC().Format(time.RFC3339Nano)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("release pod %s for a reset: %w", pod.Name, err)
	}
	return nil
}

// ReleaseReset frees a pod whose Execution ended on it and whose interpreter
// was then replaced (reusePolicy FreshInterpreter), back among its pool's idle
// pods: one write, where ReleaseForReset and ReturnToPool take two. The claim
// stays on the pod while the interpreter is replaced, so nothing can claim it
// meanwhile. It does nothing to a pod ex no longer holds.
func ReleaseReset(ctx context.Context, c client.Client, pod *corev1.Pod, ex *sandboxv1alpha1.Execution) error {
	if ClaimedBy(pod) != ex.UID {
		return nil
	}
	delete(pod.Annotations, sandboxpod.AnnotationClaimedBy)
	delete(pod.Annotations, sandboxpod.AnnotationClaimedUID)
	delete(pod.Annotations, sandboxpod.AnnotationResetSince)
	delete(pod.Labels, sandboxpod.LabelSession)
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateIdle
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("return pod %s to its pool after a reset: %w", pod.Name, err)
	}
	return nil
}

// ReturnToPool puts a pod whose interpreter was replaced back among the pool's
// idle pods. It does nothing unless the pod is still resetting.
func ReturnToPool(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	if pod.Labels[sandboxpod.LabelState] != sandboxpod.StateResetting {
		return nil
	}
	delete(pod.Annotations, sandboxpod.AnnotationResetSince)
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateIdle
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("return pod %s to its pool: %w", pod.Name, err)
	}
	return nil
}

// ResetSince returns when the pod went into StateResetting.
func ResetSince(pod *corev1.Pod) (time.Time, bool) {
	if pod.Labels[sandboxpod.LabelState] != sandboxpod.StateResetting {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, pod.Annotations[sandboxpod.AnnotationResetSince])
	if err != nil {
		return pod.CreationTimestamp.Time, true
	}
	return t, true
}
