package lease

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// A Session leases its pod for its whole life: the pod carries the Session's
// name in LabelSession and no claimed-by annotation, which leaves it free for
// the Session's own runs (Executions naming the Session claim it one at a
// time, data-plane runs go straight to its agent) and for nothing else.

// OrphanSessionPodGrace is how long a session pod whose Session is gone or
// ended stays before its pool deletes it; the Session controller frees the
// pod of an ended Session until then.
const OrphanSessionPodGrace = 30 * time.Second

// SessionUID returns the UID of the Session object that holds the pod; ""
// for a pod of a session from before Session objects existed.
func SessionUID(pod *corev1.Pod) types.UID {
	return types.UID(pod.Annotations[sandboxpod.AnnotationSessionUID])
}

// HeldBy reports whether pod is the pod of Session ses: its name, and its UID
// when the pod records one. A Session deleted and created again under the same
// name is another Session, with none of the first one's state. Once the
// Session is Ready, only the pod of the UID its status records is: labels
// and annotations can be copied onto a pod made under the gone pod's name
// by anyone who may create pods, a UID cannot.
func HeldBy(pod *corev1.Pod, ses *sandboxv1alpha1.Session) bool {
	uid := SessionUID(pod)
	return Session(pod) == ses.Name && Tenant(pod) == ses.Namespace && (uid == "" || uid == ses.UID) &&
		(ses.Status.PodUID == "" || ses.Status.PodUID == pod.UID)
}

// ClaimableForSession reports whether ses may take pod (as read): an idle
// fresh pod, or its own pod that no run holds (left by a manager that stopped
// between the claim and the Session's status).
func ClaimableForSession(pod *corev1.Pod, ses *sandboxv1alpha1.Session) bool {
	if sandboxpod.IsTerminal(pod) || !sandboxpod.IsReady(pod) || ClaimedBy(pod) != "" || !ServesTenant(pod, ses.Namespace) {
		return false
	}
	if Session(pod) != "" {
		return HeldBy(pod, ses)
	}
	return sandboxpod.IsIdle(pod)
}

// ClaimForSession leases pod to ses. Like Claim it commits with the pod's
// resourceVersion, so two claims of one pod cannot both succeed.
func ClaimForSession(ctx context.Context, c client.Client, pod *corev1.Pod, ses *sandboxv1alpha1.Session, now time.Time) error {
	if !ClaimableForSession(pod, ses) {
		return ErrNotClaimable
	}
	if HeldBy(pod, ses) && SessionUID(pod) == ses.UID {
		return nil // adopted: the lease was written before
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	markTenant(pod, ses.Namespace)
	pod.Labels[sandboxpod.LabelSession] = ses.Name
	pod.Annotations[sandboxpod.AnnotationSessionUID] = string(ses.UID)
	pod.Annotations[sandboxpod.AnnotationUsed] = "true"
	pod.Annotations[sandboxpod.AnnotationLastUsed] = now.UTC().Format(time.RFC3339Nano)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("claim pod %s for session %s: %w", pod.Name, ses.Name, err)
	}
	return nil
}

// ReleaseSessionForReset ends a Session's lease on pod into StateResetting
// (reusePolicy FreshInterpreter). It does nothing to a pod that is not the
// Session's or that a run still holds.
func ReleaseSessionForReset(ctx context.Context, c client.Client, pod *corev1.Pod, ses *sandboxv1alpha1.Session, now time.Time) error {
	if !HeldBy(pod, ses) || ClaimedBy(pod) != "" {
		return nil
	}
	delete(pod.Labels, sandboxpod.LabelSession)
	delete(pod.Annotations, sandboxpod.AnnotationSessionUID)
	delete(pod.Annotations, sandboxpod.AnnotationInterpreter)
	delete(pod.Annotations, sandboxpod.AnnotationSuspending)
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateResetting
	pod.Annotations[sandboxpod.AnnotationResetSince] = now.UTC().Format(time.RFC3339Nano)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("release pod %s of session %s for a reset: %w", pod.Name, ses.Name, err)
	}
	return nil
}

// Suspending reports whether the manager is suspending the Session of pod
// from it (MarkSuspending).
func Suspending(pod *corev1.Pod) bool { return pod.Annotations[sandboxpod.AnnotationSuspending] != "" }

// MarkSuspending takes a Session's pod from its Executions before the
// Session is suspended: no Execution may claim it afterwards. It commits
// with the pod's resourceVersion, so it and an Execution's claim cannot both
// succeed: whichever comes second fails with a conflict (or, for this one,
// ErrNotClaimable when a run holds the pod).
func MarkSuspending(ctx context.Context, c client.Client, pod *corev1.Pod, ses *sandboxv1alpha1.Session) error {
	if !HeldBy(pod, ses) || ClaimedBy(pod) != "" {
		return ErrNotClaimable
	}
	if Suspending(pod) {
		return nil
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[sandboxpod.AnnotationSuspending] = string(ses.UID)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("mark pod %s of session %s suspending: %w", pod.Name, ses.Name, err)
	}
	return nil
}

// UnmarkSuspending gives a Session's pod back to its Executions after a
// suspend that did not commit.
func UnmarkSuspending(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	if !Suspending(pod) {
		return nil
	}
	delete(pod.Annotations, sandboxpod.AnnotationSuspending)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("unmark pod %s: %w", pod.Name, err)
	}
	return nil
}
