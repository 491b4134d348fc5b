package execution

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// reconcilePending takes a waiting Execution through the dispatcher's
// decision to a claimed pod and a started run.
func (r *Reconciler) reconcilePending(ctx context.Context, ex *sandboxv1alpha1.Execution, next *afterWrite) (ctrl.Result, error) {
	first := ex.Status.Phase == ""
	if first {
		ex.Status.Phase = sandboxv1alpha1.PhasePending
	}
	if ex.Spec.Cancel {
		r.end(ex, sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled, "cancelled before it ran", nil, "")
		return ctrl.Result{}, nil
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ex.PoolKey(), pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.waiting(ex, sandboxv1alpha1.ReasonPoolNotFound, fmt.Sprintf(
			"SandboxPool %q not found in namespace %s: create it, or fix spec.poolRef", ex.Spec.PoolRef.Name, ex.PoolKey().Namespace))
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if err := r.Tenancy.Admit(ctx, pool, ex.Namespace); err != nil {
		var refused *tenancy.Refusal
		if !errors.As(err, &refused) {
			return ctrl.Result{}, err
		}
		// It waits: the platform may yet label the namespace or share the pool.
		r.waiting(ex, refused.Reason, refused.Message)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if limit := sandboxpod.MaxTimeout(pool); timeoutOf(ex, pool) > limit {
		msg := fmt.Sprintf("spec.timeout %s is longer than pool %s allows (spec.executionDefaults.maxTimeout %s): "+
			"ask for at most %s, or have the pool's owner raise its maxTimeout", timeoutOf(ex, pool), pool.Name, limit, limit)
		r.end(ex, sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonTimeoutAboveLimit, msg,
			&sandboxv1alpha1.ExecutionError{Type: sandboxv1alpha1.ReasonTimeoutAboveLimit, Message: msg}, "")
		return ctrl.Result{}, nil
	}
	if first && ex.Spec.CodeFrom != nil {
		// Say at once when the code cannot be read, rather than after the wait for a pod.
		if _, err := r.code(ctx, ex); err != nil {
			r.codeFailed(ex, err)
			return ctrl.Result{}, nil
		}
	}
	// Claimed earlier, but the Running status was lost: carry on with that
	// pod, if it is one the gate admits (anyone who may create pods can
	// write the claim of a waiting Execution on one).
	claimed, err := r.claimedPods(ctx, ex.PoolKey().Namespace, ex.UID)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, pod := range claimed {
		if podUID, ok := r.abandoned.Load(ex.UID); ok && podUID == pod.UID {
			continue // deleted by neverReached; the cache has not shown it yet
		}
		if err := r.Gate.Admit(pool, pod, agentgate.ForExecution(ex)); err != nil {
			logf.FromContext(ctx).Info("ignoring a pod that carries the Execution's claim", "pod", pod.Name, "reason", err.Error())
			r.Recorder.Eventf(ex, pod, corev1.EventTypeWarning, sandboxv1alpha1.ReasonSandboxRefused, "Claim",
				"ignoring pod %s, which carries this Execution's claim: %v", pod.Name, err)
			continue
		}
		return r.start(ctx, ex, pool, pod, next)
	}

	var ses *sandboxv1alpha1.Session // Ready, when ex names one
	if ex.Spec.Session != "" {
		ready, res, done, err := r.sessionGate(ctx, ex)
		if done || err != nil {
			return res, err
		}
		ses = ready
	}
	pl := r.Dispatcher.Place(ex)
	if pl.Pod != "" && ex.Spec.Session != "" {
		// The Session's status is the commit point of its lease: a run of the
		// session goes only to the pod it names, never to a second pod a
		// retried lease left labelled with the Session.
		if ses.Status.PodName != "" && ses.Status.PodName != pl.Pod {
			r.Dispatcher.ClaimFailed(ex.UID, pl.Pod, "")
			r.waitingFor(ex, pool, dispatch.Placement{})
			return ctrl.Result{RequeueAfter: waitBackstop}, nil
		}
		preds, err := r.sessionPredecessors(ctx, ex)
		if err != nil {
			return ctrl.Result{}, err
		}
		if len(preds) > 0 {
			// The dispatcher did not know them yet: tell it, and give the pod back.
			for _, o := range preds {
				r.Dispatcher.UpdateExecution(o)
			}
			r.Dispatcher.ClaimFailed(ex.UID, pl.Pod, "")
			r.waitingFor(ex, pool, dispatch.Placement{SessionBusy: true})
			return ctrl.Result{RequeueAfter: waitBackstop}, nil
		}
	}
	if pl.OverWaitingLimit {
		limit := tenancy.PolicyFor(pool, ex.Namespace).MaxWaiting
		r.fail(ex, sandboxv1alpha1.ReasonTenantQueueFull, fmt.Sprintf(
			"%d Executions of namespace %s wait for a pod of the shared pool %s already, its limit (spec.sharing maxWaiting): try again when fewer wait",
			limit, ex.Namespace, ex.Spec.PoolRef.String()), "")
		return ctrl.Result{}, nil
	}
	if pl.Pod == "" {
		r.waitingFor(ex, pool, pl)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	return r.claimAndStart(ctx, ex, pool, ses, pl.Pod, next)
}

// waitingFor says what the Execution waits for.
func (r *Reconciler) waitingFor(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, pl dispatch.Placement) {
	switch {
	case pl.SessionBusy && pl.SessionPod != "":
		r.waiting(ex, sandboxv1alpha1.ReasonSessionBusy, fmt.Sprintf("session %s's pod %s is busy with an earlier Execution of the session", ex.Spec.Session, pl.SessionPod))
		return
	case pl.SessionBusy:
		r.waiting(ex, sandboxv1alpha1.ReasonSessionBusy, fmt.Sprintf("waiting for earlier Executions of session %s", ex.Spec.Session))
		return
	case ex.Spec.Session != "":
		r.waiting(ex, sandboxv1alpha1.ReasonSessionPending, fmt.Sprintf("waiting for the pod of Session %s", ex.Spec.Session))
		return
	case pl.TenantLimit:
		r.waiting(ex, sandboxv1alpha1.ReasonTenantLimitReached, fmt.Sprintf(
			"namespace %s holds as many pods of the shared pool %s as it may (spec.sharing maxPods %d): waiting for one of them to be freed",
			ex.Namespace, ex.Spec.PoolRef.String(), tenancy.PolicyFor(pool, ex.Namespace).MaxPods))
		return
	}
	// Why the pool has no pod for it, from the pool's own status. No queue
	// position: it would change, and cost a status write, for every waiting
	// Execution each time the queue moves.
	if c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionDegraded); c != nil && c.Status == metav1.ConditionTrue {
		r.waiting(ex, c.Reason, fmt.Sprintf("pool %s cannot start pods: %s", pool.Name, c.Message))
		return
	}
	if c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionScalingLimited); c != nil &&
		c.Status == metav1.ConditionTrue && c.Reason == sandboxv1alpha1.ReasonResourceQuota {
		r.waiting(ex, c.Reason, fmt.Sprintf("pool %s cannot start pods: %s", pool.Name, c.Message))
		return
	}
	if c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionReady); c != nil &&
		c.Reason == sandboxv1alpha1.ReasonMaxPodsReached {
		r.waiting(ex, sandboxv1alpha1.ReasonMaxPodsReached, c.Message)
		return
	}
	r.waiting(ex, sandboxv1alpha1.ReasonNoIdleSandbox, fmt.Sprintf(
		"no idle pod in pool %s: queued in creation order while the pool adds pods", pool.Name))
}

// claimAndStart claims the pod the dispatcher chose and starts the run. A
// claim that does not commit sends the Execution back to its place in the queue.
func (r *Reconciler) claimAndStart(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	ses *sandboxv1alpha1.Session, podName string, next *afterWrite) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: podName}, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Dispatcher.ClaimFailed(ex.UID, podName, "")
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if !lease.Claimable(pod, ex) {
		r.Dispatcher.ClaimFailed(ex.UID, podName, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if ses != nil && !lease.HeldBy(pod, ses) {
		// Another pod under the name of the Session's (the UID differs): its
		// pod is gone, and the Session controller marks it Lost.
		logf.FromContext(ctx).Info("not claiming a pod that is not the Session's", "pod", podName, "session", ses.Name)
		r.Dispatcher.ClaimFailed(ex.UID, podName, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if err := lease.MayServe(pool, pod, r.Keys); err != nil {
		// The dispatcher judged it from an event; this is the pod as it is now.
		logf.FromContext(ctx).Info("not claiming a pod that is not the pool's", "pod", podName, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ex.UID, podName, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	if err := r.Gate.Agents().Check(ctx, pod); err != nil {
		// Its pool replaces a pod whose agent the manager does not speak.
		logf.FromContext(ctx).Info("not claiming a pod whose agent cannot be called", "pod", podName, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ex.UID, podName, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	// The claim is written next (Reconcile), and the code sent once it is stored.
	toClaim := pod.DeepCopy()
	res, err := r.start(ctx, ex, pool, pod, next)
	if next.send == nil {
		// It ended before it ran (its code could not be read): the pod was never claimed.
		ex.Status.PodName, ex.Status.PodUID, ex.Status.PodDisposition = "", "", ""
		r.Dispatcher.ClaimFailed(ex.UID, podName, "")
		return res, err
	}
	next.claim = toClaim
	return res, err
}

// unclaimed puts a Running Execution whose claim did not commit back in the
// queue. Its code was never sent: code is sent only once the claim and the
// Running status are both stored.
func (r *Reconciler) unclaimed(ex *sandboxv1alpha1.Execution, why string) {
	ex.Status.Phase = sandboxv1alpha1.PhasePending
	ex.Status.PodName, ex.Status.PodUID, ex.Status.StartTime, ex.Status.CodeDigest = "", "", nil, ""
	r.waiting(ex, sandboxv1alpha1.ReasonNoIdleSandbox, why)
}

// start marks the Execution Running on its claimed pod; the run is sent once
// that status is stored (afterWrite). The agent keys runs by the Execution's
// UID, so a second send after a lost reply attaches to the first.
func (r *Reconciler) start(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, next *afterWrite) (ctrl.Result, error) {
	code, err := r.code(ctx, ex)
	if err != nil {
		r.codeFailed(ex, err)
		ex.Status.PodName, ex.Status.PodUID, ex.Status.PodDisposition = pod.Name, pod.UID, unusedPodDisposition(ex)
		return ctrl.Result{}, nil
	}
	job := r.job(ex, pool, pod, r.now())
	job.Request = r.request(ex, pool, code)
	if ex.Spec.Session != "" {
		// Only on the interpreter that holds the session's state.
		job.Request.Interpreter = r.sessionInterpreter(ctx, ex, pod)
	}
	job.Bridge, job.MaxBridgeCalls = r.Models.Bridge(ctx, pool)
	job.CodeDigest = digest(code)
	r.markRunning(ex, pod.Name, pod.UID, metav1.NewTime(job.StartTime), job.CodeDigest)
	next.send, next.pool, next.pod = &job, pool, pod
	return ctrl.Result{}, nil
}

func (r *Reconciler) markRunning(ex *sandboxv1alpha1.Execution, pod string, podUID types.UID, start metav1.Time, codeDigest string) {
	ex.Status.Phase = sandboxv1alpha1.PhaseRunning
	ex.Status.PodName, ex.Status.PodUID = pod, podUID
	ex.Status.StartTime = &start
	ex.Status.CodeDigest = codeDigest
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionWaitingForSandbox,
		Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.ReasonSandboxClaimed, Message: "running on pod " + pod})
}

func digest(code string) string {
	sum := sha256.Sum256([]byte(code))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// job is the run of ex on pod, without its request (re-attaching sends
// none) and without its agent (the gate opens it just before the call).
func (r *Reconciler) job(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, start time.Time) runner.Job {
	if ex.Status.StartTime != nil {
		start = ex.Status.StartTime.Time
	}
	return runner.Job{
		UID: ex.UID, Namespace: ex.Namespace, Name: ex.Name, Pod: pod.Name, PodUID: pod.UID, StartTime: start,
		CodeDigest: ex.Status.CodeDigest, Deadline: start.Add(timeoutOf(ex, pool)), Grace: graceOf(pool),
	}
}

func (r *Reconciler) request(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool, code string) protocol.ExecuteRequest {
	req := protocol.ExecuteRequest{
		Code:           code,
		Language:       string(ex.Spec.Language),
		MaxOutputBytes: int(pool.Spec.ExecutionDefaults.MaxOutputBytes),
	}
	if ex.Spec.Context != nil {
		if ex.Spec.ContextFormat == sandboxv1alpha1.ContextJSON {
			req.Context = json.RawMessage(*ex.Spec.Context)
		} else {
			req.Context, _ = json.Marshal(*ex.Spec.Context)
		}
	}
	if len(ex.Spec.Env) > 0 {
		req.Env = map[string]string{}
		for _, e := range ex.Spec.Env {
			req.Env[e.Name] = e.Value
		}
	}
	return req
}

func timeoutOf(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool) time.Duration {
	if ex.Spec.Timeout != nil {
		return ex.Spec.Timeout.Duration
	}
	if pool.Spec.ExecutionDefaults.Timeout != nil {
		return pool.Spec.ExecutionDefaults.Timeout.Duration
	}
	return protocol.DefaultTimeout
}

func graceOf(pool *sandboxv1alpha1.SandboxPool) time.Duration {
	if g := pool.Spec.ExecutionDefaults.InterruptGracePeriod; g != nil {
		return g.Duration
	}
	return protocol.DefaultGrace
}

// code returns the code to run, reading spec.codeFrom when set (uncached: the
// manager does not watch every ConfigMap and Secret of the cluster). Only
// objects their owner marked with LabelCodeSource are read: the manager may
// read any Secret, a tenant who may create Executions may not.
func (r *Reconciler) code(ctx context.Context, ex *sandboxv1alpha1.Execution) (string, error) {
	if ex.Spec.Code != nil {
		return *ex.Spec.Code, nil
	}
	from := ex.Spec.CodeFrom
	if from == nil {
		return "", errors.New("neither spec.code nor spec.codeFrom is set")
	}
	kind, ref := "ConfigMap", from.ConfigMapKeyRef
	var obj client.Object = &corev1.ConfigMap{}
	if ref == nil {
		kind, ref, obj = "Secret", from.SecretKeyRef, &corev1.Secret{}
	}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ref.Name}, obj); err != nil {
		return "", fmt.Errorf("spec.codeFrom: %s %s: %w", kind, ref.Name, err)
	}
	if obj.GetLabels()[sandboxv1alpha1.LabelCodeSource] != "true" {
		return "", &unmarkedSourceError{fmt.Sprintf("spec.codeFrom: %s %s is not marked as code for Executions; its owner must "+
			"label it: kubectl label %s %s %s=true", kind, ref.Name, strings.ToLower(kind), ref.Name, sandboxv1alpha1.LabelCodeSource)}
	}
	var v string
	var ok bool
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		v, ok = o.Data[ref.Key]
	case *corev1.Secret:
		var b []byte
		b, ok = o.Data[ref.Key]
		v = string(b)
	}
	if !ok {
		return "", fmt.Errorf("spec.codeFrom: %s %s has no key %q", kind, ref.Name, ref.Key)
	}
	return v, nil
}

// codeFailed ends an Execution whose code could not be read.
func (r *Reconciler) codeFailed(ex *sandboxv1alpha1.Execution, err error) {
	reason := sandboxv1alpha1.ReasonCodeSourceNotFound
	var unmarked *unmarkedSourceError
	if errors.As(err, &unmarked) {
		reason = sandboxv1alpha1.ReasonCodeSourceNotMarked
	}
	r.fail(ex, reason, err.Error(), "")
}

// unmarkedSourceError: codeFrom names an object not marked with LabelCodeSource.
type unmarkedSourceError struct{ msg string }

func (e *unmarkedSourceError) Error() string { return e.msg }
