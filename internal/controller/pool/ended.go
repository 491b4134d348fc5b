package pool

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// A pod that ended (its container killed at the memory limit, evicted, or
// its agent gone) under an Execution or a Session that has not stored its
// final status yet is that object's evidence: its controller reads from the
// pod why it ended ("your code used more than 512Mi") and then carries out
// the pod's disposition (an Execution) or frees it (a Session). Deleted
// first, the pod leaves only "SandboxLost". So the pool leaves such a pod
// alone, and replaces it only when its holder has its final status, names
// another pod, is gone, or endedPodBackstop has passed since the pod ended
// (a manager that never got to it).

// endedPodBackstop bounds how long an ended pod waits for its Execution.
const endedPodBackstop = 2 * time.Minute

// awaitsFinalStatus says whether an ended pod is left for its Execution,
// recording when to look again.
func (r *Reconciler) awaitsFinalStatus(ctx context.Context, out *poolPods, p *corev1.Pod, now time.Time) bool {
	if !r.heldUnfinished(ctx, p) {
		return false
	}
	return out.expiresIn(endedAt(p), endedPodBackstop, now) > 0
}

// heldUnfinished reports whether the Execution that claims p, else the
// Session that holds it, has not stored its final status and records p as
// its pod.
func (r *Reconciler) heldUnfinished(ctx context.Context, p *corev1.Pod) bool {
	if uid := lease.ClaimedBy(p); uid != "" {
		ex := &sandboxv1alpha1.Execution{}
		key := types.NamespacedName{Namespace: lease.Tenant(p), Name: p.Annotations[sandboxpod.AnnotationClaimedBy]}
		return r.Get(ctx, key, ex) == nil && ex.UID == uid && !ex.Status.Phase.IsFinished() &&
			(ex.Status.PodName == "" || ex.Status.PodName == p.Name) && (ex.Status.PodUID == "" || ex.Status.PodUID == p.UID)
	}
	if name := lease.Session(p); name != "" {
		ses := &sandboxv1alpha1.Session{}
		key := types.NamespacedName{Namespace: lease.Tenant(p), Name: name}
		return r.Get(ctx, key, ses) == nil && ses.UID == lease.HolderUID(p, ses) && !ses.Status.Phase.IsFinished() &&
			(ses.Status.PodUID == "" || ses.Status.PodUID == p.UID)
	}
	return false
}

// endedAt is when the pod's container ended, as the kubelet reported it
// (else when the pod stopped being ready, else when it was created).
func endedAt(p *corev1.Pod) time.Time {
	var t time.Time
	for _, cs := range p.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil && term.FinishedAt.After(t) {
			t = term.FinishedAt.Time
		}
	}
	if !t.IsZero() {
		return t
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}
