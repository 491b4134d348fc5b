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
		(uid != "" || runOf(pod, ses)) && (ses.Status.PodUID == "" || ses.Status.PodUID == pod.UID)
}

// runOf reports whether a pod claimed without a Session UID may be ses's:
// one the data plane claimed for a run (ClaimForRun) is the Session of that
// run and caller alone (a Session made again under the name by someone
// else is not; spec.owner is set by admission, not by the creator); one
// from before Session objects is any Session's of its name.
func runOf(pod *corev1.Pod, ses *sandboxv1alpha1.Session) bool {
	run, ok := pod.Annotations[sandboxpod.AnnotationRun]
	return !ok || run != "" && run == ses.Annotations[sandboxv1alpha1.AnnotationRun] && pod.Annotations[sandboxpod.AnnotationRunOwner] == ses.Spec.Owner
}

// ForRun reports whether the data plane claimed pod for a one-call run (ClaimForRun).
func ForRun(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[sandboxpod.AnnotationRun]
	return ok
}

// HolderUID is the UID of the Session that holds pod by its lease: the
// UID it records, or, for a pod the data plane claimed for a one-call run,
// ses's when the run and caller are ses's. "" when ses does not hold it.
func HolderUID(pod *corev1.Pod, ses *sandboxv1alpha1.Session) types.UID {
	if uid := SessionUID(pod); uid != "" || !ForRun(pod) {
		return uid
	}
	if HeldBy(pod, ses) {
		return ses.UID
	}
	return ""
}

// ClaimForRun leases an idle pod to the Session a one-call run is creating
// (ses, not created yet: it has no UID), with the pod's resourceVersion as
// precondition like every claim. The data plane writes it at the same time
// as it creates the Session, so the run's code waits for one write's time,
// not two in a row; the manager adopts the pod for the Session once both
// are stored, as it is (HolderUID): the run and its caller name the Session.
func ClaimForRun(ctx context.Context, c client.Client, pod *corev1.Pod, ses *sandboxv1alpha1.Session, now time.Time) error {
	run := ses.Annotations[sandboxv1alpha1.AnnotationRun]
	if run == "" || sandboxpod.IsTerminal(pod) || !sandboxpod.IsIdle(pod) || Session(pod) != "" || ClaimedBy(pod) != "" ||
		!ServesTenant(pod, ses.Namespace) {
		return ErrNotClaimable
	}
	markHeld(pod, ses, now)
	pod.Annotations[sandboxpod.AnnotationRun] = run
	pod.Annotations[sandboxpod.AnnotationRunOwner] = ses.Spec.Owner
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("claim pod %s for run %s: %w", pod.Name, run, err)
	}
	return nil
}

// UnclaimRun gives back a pod claimed for a run whose Session could not be
// created: nothing ran on it, and it is idle again as it was (before: the
// pod as it was read before ClaimForRun; claimed: as that claim stored it).
func UnclaimRun(ctx context.Context, c client.Client, before, claimed *corev1.Pod) error {
	pod := claimed.DeepCopy()
	pod.Labels, pod.Annotations = before.DeepCopy().Labels, before.DeepCopy().Annotations
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("give back pod %s: %w", pod.Name, err)
	}
	return nil
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
	if HeldBy(pod, ses) && (SessionUID(pod) == ses.UID || SessionUID(pod) == "" && ForRun(pod)) {
		// Adopted: the lease was written before, by this controller or, for a
		// one-call run, by the data plane (its run and caller name the Session).
		return nil
	}
	markHeld(pod, ses, now)
	pod.Annotations[sandboxpod.AnnotationSessionUID] = string(ses.UID)
	if err := c.Update(ctx, pod); err != nil {
		return fmt.Errorf("claim pod %s for session %s: %w", pod.Name, ses.Name, err)
	}
	return nil
}

// markHeld labels pod as leased to the Session named ses.Name in ses's namespace.
func markHeld(pod *corev1.Pod, ses *sandboxv1alpha1.Session, now time.Time) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	markTenant(pod, ses.Namespace)
	pod.Labels[sandboxpod.LabelSession] = ses.Name
	pod.Annotations[sandboxpod.AnnotationUsed] = "true"
	pod.Annotations[sandboxpod.AnnotationLastUsed] = now.UTC().Format(time.RFC3339Nano)
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
	delete(pod.Annotations, sandboxpod.AnnotationRun)
	delete(pod.Annotations, sandboxpod.AnnotationRunOwner)
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
