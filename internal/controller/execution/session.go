package execution

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/index"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The session policy for Executions: an Execution with spec.session runs in
// the Session object of that name (created on first use, so manifests written
// before Sessions existed keep working), one at a time, in creation order, on
// the Session's pod. When the Session ends, its state is gone: the Execution
// fails SessionLost instead of silently running on a fresh interpreter, and
// so does one whose Session was deleted after earlier Executions ran in it.

// sessionGate lets an Execution of a session on to the dispatcher only while
// its Session is Ready, and returns the Session, whose status names its pod.
// done means the reconcile ends here with res (the status says why it waits,
// or that it failed).
func (r *Reconciler) sessionGate(ctx context.Context, ex *sandboxv1alpha1.Execution) (ready *sandboxv1alpha1.Session, res ctrl.Result, done bool, err error) {
	ses := &sandboxv1alpha1.Session{}
	err = r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Spec.Session}, ses)
	if apierrors.IsNotFound(err) {
		res, done, err = r.createSession(ctx, ex)
		return nil, res, done, err
	}
	if err != nil {
		return nil, ctrl.Result{}, true, err
	}
	if ses.PoolKey() != ex.PoolKey() {
		r.fail(ex, sandboxv1alpha1.ReasonSessionPoolMismatch, fmt.Sprintf(
			"Session %s leases a pod of pool %s, not %s: name that pool in spec.poolRef, or use another session",
			ses.Name, ses.Spec.PoolRef.String(), ex.Spec.PoolRef.String()), "")
		return nil, ctrl.Result{}, true, nil
	}
	if ses.Spec.Access == sandboxv1alpha1.SessionAccessOwner && ex.Spec.Owner != ses.Spec.Owner {
		// Admission proved ex.Spec.Owner is who created the Execution, and
		// ses.Spec.Owner who created the Session.
		r.fail(ex, sandboxv1alpha1.ReasonSessionOwnerOnly, fmt.Sprintf(
			"Session %s serves its owner alone (spec.access Owner), and this Execution's spec.owner is %q: only that user's Executions, with spec.owner set, run in it",
			ses.Name, ex.Spec.Owner), "")
		return nil, ctrl.Result{}, true, nil
	}
	switch ses.Status.Phase {
	case sandboxv1alpha1.SessionReady:
		return ses, ctrl.Result{}, false, nil
	case sandboxv1alpha1.SessionSuspended:
		// The Execution is the Session's next run: it asks for the resume.
		if ses.Status.Snapshot != nil && !ses.ResumeRequested() {
			patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, sandboxv1alpha1.AnnotationResume, ses.Status.Snapshot.Key)
			if err := r.Patch(ctx, ses, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return nil, ctrl.Result{}, true, fmt.Errorf("ask Session %s to resume: %w", ses.Name, err)
			}
		}
		ex.Status.SessionResumed = true
		r.waiting(ex, sandboxv1alpha1.ReasonSessionPending, fmt.Sprintf("resuming Session %s from its snapshot", ses.Name))
		return nil, ctrl.Result{RequeueAfter: waitBackstop}, true, nil
	case sandboxv1alpha1.SessionClosed, sandboxv1alpha1.SessionLost:
		why := ""
		if c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil {
			why = fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
		}
		r.fail(ex, sandboxv1alpha1.ReasonSessionLost, fmt.Sprintf(
			"Session %s is %s%s, and with it the session's state: start a new session", ses.Name, ses.Status.Phase, why), "")
		return nil, ctrl.Result{}, true, nil
	}
	msg := fmt.Sprintf("waiting for Session %s to get a pod", ses.Name)
	if c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil && c.Message != "" {
		msg += ": " + c.Message
	}
	r.waiting(ex, sandboxv1alpha1.ReasonSessionPending, msg)
	return nil, ctrl.Result{RequeueAfter: waitBackstop}, true, nil
}

// sessionInterpreter is the interpreter an Execution of a session may run on:
// the one its Session records (set when it became Ready, and by a data-plane
// reset), else the one the session's last Execution ran on.
func (r *Reconciler) sessionInterpreter(ctx context.Context, ex *sandboxv1alpha1.Execution, pod *corev1.Pod) string {
	ses := &sandboxv1alpha1.Session{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Spec.Session}, ses); err == nil &&
		lease.HeldBy(pod, ses) && ses.Status.Interpreter != "" {
		return ses.Status.Interpreter
	}
	return pod.Annotations[sandboxpod.AnnotationInterpreter]
}

// createSession makes the Session an Execution names, unless Executions of
// it already ran (then it was deleted, and its state with it).
func (r *Reconciler) createSession(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, bool, error) {
	lost, live, err := r.sessionLost(ctx, ex)
	if err != nil {
		return ctrl.Result{}, true, err
	}
	if lost != "" && live == nil {
		r.fail(ex, sandboxv1alpha1.ReasonSessionLost, fmt.Sprintf(
			"Session %s was deleted after earlier Executions ran in it (on pod %s), and with it the session's state: start a new session",
			ex.Spec.Session, lost), "")
		return ctrl.Result{}, true, nil
	}
	// A live pod labelled with the session's name (from a manager version
	// without Session objects) is adopted by the new Session.
	ses := &sandboxv1alpha1.Session{
		ObjectMeta: metav1.ObjectMeta{Namespace: ex.Namespace, Name: ex.Spec.Session,
			Annotations: map[string]string{sandboxv1alpha1.AnnotationCreatedFor: ex.Name}},
		Spec: sandboxv1alpha1.SessionSpec{PoolRef: ex.Spec.PoolRef},
	}
	if err := r.Create(ctx, ses); err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrl.Result{}, true, fmt.Errorf("create session %s for execution %s: %w", ex.Spec.Session, ex.Name, err)
	}
	r.waiting(ex, sandboxv1alpha1.ReasonSessionPending, fmt.Sprintf("created Session %s; waiting for its pod", ex.Spec.Session))
	return ctrl.Result{RequeueAfter: waitBackstop}, true, nil
}

// sessionLost returns the pod an earlier Execution of ex's session ran on
// when the session has no live pod any more; "" for a session that never had
// one (ex is its first Execution). It is called only when the dispatcher saw
// no pod for the session, and reads the pods around the cache before saying
// "lost". The pod informer can lag behind the Execution informer (and a new
// leader's dispatcher can learn of Executions before pods): a live pod found
// that way is returned, and the session must wait for it, never take a second pod.
func (r *Reconciler) sessionLost(ctx context.Context, ex *sandboxv1alpha1.Execution) (lost string, live *corev1.Pod, err error) {
	var history sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &history, client.InNamespace(ex.Namespace),
		client.MatchingFields{index.Session: index.SessionKey(ex.Spec.PoolRef.String(), ex.Spec.Session)}); err != nil {
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
	pool := ex.PoolKey()
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(pool.Namespace), client.MatchingLabels{
		sandboxpod.LabelPool: pool.Name, sandboxpod.LabelSession: ex.Spec.Session}); err != nil {
		return "", nil, fmt.Errorf("list pods of session %s: %w", ex.Spec.Session, err)
	}
	for i := range pods.Items {
		if !sandboxpod.IsTerminal(&pods.Items[i]) && lease.Tenant(&pods.Items[i]) == ex.Namespace {
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
func (r *Reconciler) sessionPredecessors(ctx context.Context, ex *sandboxv1alpha1.Execution) ([]*sandboxv1alpha1.Execution, error) {
	var list sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &list, client.InNamespace(ex.Namespace),
		client.MatchingFields{index.ActiveSession: index.SessionKey(ex.Spec.PoolRef.String(), ex.Spec.Session)}); err != nil {
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

// claimedPods returns the live (not ending) pods that carry the claim of
// the Execution with this UID: one it claimed, and any a tenant wrote the
// claim on.
func (r *Reconciler) claimedPods(ctx context.Context, namespace string, uid types.UID) ([]*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingFields{index.ClaimedUID: string(uid)}); err != nil {
		return nil, fmt.Errorf("list the pods claimed by %s: %w", uid, err)
	}
	var live []*corev1.Pod
	for i := range pods.Items {
		if !sandboxpod.IsTerminal(&pods.Items[i]) {
			live = append(live, &pods.Items[i])
		}
	}
	return live, nil
}
