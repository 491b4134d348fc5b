package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agent/protocol"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/claim"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// sessionBackstop re-checks an Execution waiting for its session, in case a wake-up was missed.
const sessionBackstop = 5 * time.Second

// claimRetry is how soon an Execution that lost a claim race tries again.
const claimRetry = 20 * time.Millisecond

// ExecutionReconciler runs Executions: queue, claim a pod, run, timeout, status.
type ExecutionReconciler struct {
	client.Client
	// APIReader reads around the cache, to confirm a lost pod before failing an
	// Execution for it: the pod informer can lag behind the Execution informer.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Runner    *runner.Runner
	Resolver  runner.Resolver
	// Keys sign the tokens of each call to an agent (for the runner NewRunner makes).
	Keys *agentauth.Keyring
}

func (r *ExecutionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ex := &sandboxv1alpha1.Execution{}
	if err := r.Get(ctx, req.NamespacedName, ex); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.deleted(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if ex.Status.Phase.IsFinished() {
		return r.reconcileFinished(ctx, ex)
	}
	if !r.Keys.Loaded() {
		// Right after a restart: re-attaching now would find every running pod
		// unreachable and fail its Execution. Wait for AgentKeysReconciler.
		logf.FromContext(ctx).V(1).Info("waiting for the agent signing keys to load")
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}

	orig := ex.DeepCopy()
	var result ctrl.Result
	var err error
	var afterStatus func(context.Context) error
	if ex.Status.Phase == sandboxv1alpha1.PhaseRunning {
		result, afterStatus, err = r.reconcileRunning(ctx, ex)
	} else {
		result, err = r.reconcilePending(ctx, ex)
	}
	ex.Status.ObservedGeneration = ex.Generation
	if !equality.Semantic.DeepEqual(orig.Status, ex.Status) {
		// The optimistic lock makes a reconcile that worked from a stale cache
		// fail here instead of overwriting a newer status.
		patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
		if perr := r.Status().Patch(ctx, ex, patch); perr != nil {
			if apierrors.IsConflict(perr) {
				return ctrl.Result{Requeue: true}, err
			}
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("update status of execution %s: %w", ex.Name, perr))
		}
		if !orig.Status.Phase.IsFinished() && ex.Status.Phase.IsFinished() {
			r.recordEnd(ex)
		}
	}
	if afterStatus != nil && err == nil {
		err = afterStatus(ctx)
	}
	return result, err
}

// reconcileFinished forgets the run and applies the TTL.
func (r *ExecutionReconciler) reconcileFinished(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, error) {
	r.Runner.Forget(ex.UID)
	if ex.Spec.TTLSecondsAfterFinished == nil || ex.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	expire := ex.Status.CompletionTime.Add(time.Duration(*ex.Spec.TTLSecondsAfterFinished) * time.Second)
	if left := time.Until(expire); left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	logf.FromContext(ctx).V(1).Info("deleting finished execution after its TTL")
	return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, ex, client.PropagationPolicy(metav1.DeletePropagationBackground)))
}

func (r *ExecutionReconciler) reconcilePending(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, error) {
	if job, ok := r.Runner.Job(ex.UID); ok {
		// It claimed a pod and started, but the cache does not show it yet (or
		// writing Running lost a race): claiming again would take a second pod.
		r.markRunning(ex, job.Pod, metav1.NewTime(job.StartTime))
		return ctrl.Result{}, nil
	}
	if ex.Status.Phase == "" {
		ex.Status.Phase = sandboxv1alpha1.PhasePending
	}
	if ex.Spec.Cancel {
		r.end(ex, sandboxv1alpha1.PhaseCancelled, sandboxv1alpha1.ReasonCancelled, "cancelled before it ran", nil)
		return ctrl.Result{}, nil
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Spec.PoolRef.Name}, pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.waiting(ex, sandboxv1alpha1.ReasonPoolNotFound, fmt.Sprintf(
			"SandboxPool %q not found in namespace %s: create it, or fix spec.poolRef", ex.Spec.PoolRef.Name, ex.Namespace))
		return ctrl.Result{}, nil
	}
	code, err := r.code(ctx, ex)
	if err != nil {
		reason := sandboxv1alpha1.ReasonCodeSourceNotFound
		var unmarked *unmarkedSourceError
		if errors.As(err, &unmarked) {
			reason = sandboxv1alpha1.ReasonCodeSourceNotMarked
		}
		r.end(ex, sandboxv1alpha1.PhaseFailed, reason, err.Error(),
			&sandboxv1alpha1.ExecutionError{Type: reason, Message: err.Error()})
		return ctrl.Result{}, nil
	}

	var podList corev1.PodList
	if err := r.List(ctx, &podList, client.InNamespace(ex.Namespace), client.MatchingLabels{sandboxpod.LabelPool: pool.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list pods of pool %s: %w", pool.Name, err)
	}
	var sessionPod *corev1.Pod
	sessionPods := map[string]bool{}
	for i := range podList.Items {
		p := &podList.Items[i]
		if claim.ClaimedBy(p) == ex.UID && !sandboxpod.IsTerminal(p) {
			// Claimed earlier, but the status write was lost: carry on with it.
			return r.start(ctx, ex, pool, p, code)
		}
		if s := claim.Session(p); s != "" && !sandboxpod.IsTerminal(p) {
			sessionPods[s] = true
			if s == ex.Spec.Session {
				sessionPod = p
			}
		}
	}
	var execs sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &execs, client.InNamespace(ex.Namespace), client.MatchingFields{indexActive: pool.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list executions of pool %s: %w", pool.Name, err)
	}

	if s := ex.Spec.Session; s != "" {
		// Wake-ups come from the session's pod and Executions; the requeue is a backstop.
		if !firstOfSession(execs.Items, ex) {
			r.waiting(ex, "SessionBusy", fmt.Sprintf("waiting for earlier Executions of session %s to finish", s))
			return ctrl.Result{RequeueAfter: sessionBackstop}, nil
		}
		if sessionPod != nil {
			if claim.ClaimedBy(sessionPod) != "" || !sandboxpod.IsReady(sessionPod) {
				r.waiting(ex, "SessionBusy", fmt.Sprintf("session %s's pod %s is busy", s, sessionPod.Name))
				return ctrl.Result{RequeueAfter: sessionBackstop}, nil
			}
			return r.claimAndStart(ctx, ex, pool, sessionPod, code)
		}
		var history sandboxv1alpha1.ExecutionList
		if err := r.List(ctx, &history, client.InNamespace(ex.Namespace), client.MatchingFields{indexSession: s}); err != nil {
			return ctrl.Result{}, fmt.Errorf("list executions of session %s: %w", s, err)
		}
		if lost := lostSessionPod(history.Items, s); lost != "" {
			msg := fmt.Sprintf("session %s's pod %s is gone (lost, timed out, or idle longer than the pool's sessionIdleTimeout), "+
				"and with it the session's state: start a new session", s, lost)
			r.end(ex, sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonSessionLost, msg,
				&sandboxv1alpha1.ExecutionError{Type: sandboxv1alpha1.ReasonSessionLost, Message: msg})
			return ctrl.Result{}, nil
		}
	}

	q := queue(execs.Items, func(s string) bool { return sessionPods[s] })
	pos := position(q, ex)
	idle := idlePods(pool, podList.Items)
	if pos < 0 || pos >= len(idle) {
		// No queue position in the message: it would change, and cost a status
		// write, for every waiting Execution each time the queue moves.
		reason, msg := sandboxv1alpha1.ReasonNoIdleSandbox, fmt.Sprintf(
			"no idle pod in pool %s: queued in creation order while the pool adds pods", pool.Name)
		if c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionReady); c != nil &&
			c.Reason == sandboxv1alpha1.ReasonMaxPodsReached {
			reason, msg = sandboxv1alpha1.ReasonMaxPodsReached, c.Message
		}
		r.waiting(ex, reason, msg)
		return ctrl.Result{}, nil
	}
	return r.claimAndStart(ctx, ex, pool, idle[pos], code)
}

// idlePods are the pool's claimable pods, current template first, by name.
func idlePods(pool *sandboxv1alpha1.SandboxPool, pods []corev1.Pod) []*corev1.Pod {
	hash := sandboxpod.TemplateHash(pool)
	var out []*corev1.Pod
	for i := range pods {
		if sandboxpod.IsIdle(&pods[i]) && claim.ClaimedBy(&pods[i]) == "" && claim.Session(&pods[i]) == "" {
			out = append(out, &pods[i])
		}
	}
	sort.Slice(out, func(i, j int) bool {
		ci, cj := out[i].Labels[sandboxpod.LabelTemplateHash] == hash, out[j].Labels[sandboxpod.LabelTemplateHash] == hash
		if ci != cj {
			return ci
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// lostSessionPod returns the pod an earlier Execution of the session ran on,
// when the session has no pod any more.
func lostSessionPod(all []sandboxv1alpha1.Execution, session string) string {
	for i := range all {
		if all[i].Spec.Session == session && all[i].Status.PodName != "" {
			return all[i].Status.PodName
		}
	}
	return ""
}

func (r *ExecutionReconciler) claimAndStart(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, code string) (ctrl.Result, error) {
	pod = pod.DeepCopy()
	if err := claim.Claim(ctx, r.Client, pod, ex); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || errors.Is(err, claim.ErrNotClaimable) {
			logf.FromContext(ctx).V(4).Info("lost a claim race, retrying", "pod", pod.Name)
			return ctrl.Result{RequeueAfter: claimRetry}, nil
		}
		return ctrl.Result{}, err
	}
	metrics.QueueWait.Observe(time.Since(ex.CreationTimestamp.Time).Seconds())
	return r.start(ctx, ex, pool, pod, code)
}

// start marks the Execution Running on pod and hands it to the runner.
func (r *ExecutionReconciler) start(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, code string) (ctrl.Result, error) {
	r.markRunning(ex, pod.Name, metav1.Now())
	job, err := r.job(ctx, ex, pool, pod, code)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.Runner.Start(job)
	return ctrl.Result{}, nil
}

func (r *ExecutionReconciler) markRunning(ex *sandboxv1alpha1.Execution, pod string, start metav1.Time) {
	ex.Status.Phase = sandboxv1alpha1.PhaseRunning
	ex.Status.PodName = pod
	ex.Status.StartTime = &start
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionWaitingForSandbox,
		Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.ReasonSandboxClaimed, Message: "running on pod " + pod})
}

func (r *ExecutionReconciler) job(ctx context.Context, ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, code string) (runner.Job, error) {
	addr, err := r.Resolver.Address(pod)
	if err != nil {
		return runner.Job{}, err
	}
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
	return runner.Job{
		UID: ex.UID, Namespace: ex.Namespace, Name: ex.Name, Pod: pod.Name, StartTime: ex.Status.StartTime.Time, Address: addr,
		PodUID: pod.UID, KeyID: pod.Labels[sandboxpod.LabelAgentKey], Request: req,
		Deadline: ex.Status.StartTime.Add(timeoutOf(ex, pool)), Grace: graceOf(pool),
	}, nil
}

func timeoutOf(ex *sandboxv1alpha1.Execution, pool *sandboxv1alpha1.SandboxPool) time.Duration {
	if ex.Spec.Timeout != nil {
		return ex.Spec.Timeout.Duration
	}
	if pool.Spec.ExecutionDefaults.Timeout != nil {
		return pool.Spec.ExecutionDefaults.Timeout.Duration
	}
	return 30 * time.Second
}

func graceOf(pool *sandboxv1alpha1.SandboxPool) time.Duration {
	if g := pool.Spec.ExecutionDefaults.InterruptGracePeriod; g != nil {
		return g.Duration
	}
	return 5 * time.Second
}

// code returns the code to run, reading spec.codeFrom when set (uncached: the
// manager does not watch every ConfigMap and Secret of the cluster). Only
// objects their owner marked with LabelCodeSource are read: the manager may
// read any Secret, a tenant who may create Executions may not.
func (r *ExecutionReconciler) code(ctx context.Context, ex *sandboxv1alpha1.Execution) (string, error) {
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

// unmarkedSourceError: codeFrom names an object not marked with LabelCodeSource.
type unmarkedSourceError struct{ msg string }

func (e *unmarkedSourceError) Error() string { return e.msg }

func (r *ExecutionReconciler) reconcileRunning(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, func(context.Context) error, error) {
	pool := &sandboxv1alpha1.SandboxPool{}
	poolErr := r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Spec.PoolRef.Name}, pool)
	if poolErr != nil && !apierrors.IsNotFound(poolErr) {
		return ctrl.Result{}, nil, poolErr
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Status.PodName}, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil, err
		}
		pod = nil
	}
	if pod == nil || sandboxpod.IsTerminal(pod) || claim.ClaimedBy(pod) != ex.UID {
		// The pod informer can lag behind the Execution informer (a run can end
		// before the claim is in the cache): read the pod itself before acting on it.
		live := &corev1.Pod{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ex.Namespace, Name: ex.Status.PodName}, live)
		switch {
		case apierrors.IsNotFound(err):
			pod = nil
		case err != nil:
			return ctrl.Result{}, nil, err
		default:
			pod = live
		}
	}
	if o, ok := r.Runner.Outcome(ex.UID); ok {
		after, err := r.finish(ctx, ex, pool, pod, o)
		return ctrl.Result{}, after, err
	}
	if pod == nil || sandboxpod.IsTerminal(pod) || claim.ClaimedBy(pod) != ex.UID || poolErr != nil {
		r.Runner.Cancel(ex.UID)
		msg := fmt.Sprintf("pod %s was deleted or stopped while the code ran", ex.Status.PodName)
		if pod != nil && pod.Status.Message != "" {
			msg += ": " + pod.Status.Message
		}
		r.end(ex, sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.ReasonSandboxLost, msg,
			&sandboxv1alpha1.ExecutionError{Type: sandboxv1alpha1.ReasonSandboxLost, Message: msg})
		if pod != nil {
			return ctrl.Result{}, r.deleteAfterStatus(pod), nil
		}
		return ctrl.Result{}, nil, nil
	}
	if !r.Runner.Tracked(ex.UID) {
		// A restarted manager: attach to the run in the agent by the Execution's UID.
		code, err := r.code(ctx, ex)
		if err != nil {
			return ctrl.Result{}, nil, err
		}
		job, err := r.job(ctx, ex, pool, pod, code)
		if err != nil {
			return ctrl.Result{}, nil, err
		}
		logf.FromContext(ctx).Info("re-attaching to a running execution", "pod", pod.Name)
		r.Runner.Start(job)
	}
	if ex.Spec.Cancel {
		r.Runner.Cancel(ex.UID)
	}
	// The runner wakes this Execution when the run ends; this is the backstop.
	backstop := time.Until(ex.Status.StartTime.Add(timeoutOf(ex, pool) + graceOf(pool) + 2*runner.Slack))
	return ctrl.Result{RequeueAfter: max(backstop, time.Second)}, nil, nil
}

// waiting records that the Execution waits for a pod.
func (r *ExecutionReconciler) waiting(ex *sandboxv1alpha1.Execution, reason, msg string) {
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionWaitingForSandbox,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: ex.Generation})
}

// end sets a final phase with its Complete condition.
func (r *ExecutionReconciler) end(ex *sandboxv1alpha1.Execution, phase sandboxv1alpha1.ExecutionPhase, reason, msg string,
	execErr *sandboxv1alpha1.ExecutionError) {
	now := metav1.Now()
	ex.Status.Phase = phase
	ex.Status.CompletionTime = &now
	if execErr != nil {
		ex.Status.Error = execErr
	}
	if c := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox); c != nil && c.Status == metav1.ConditionTrue {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, reason, "no longer waiting: "+string(phase)
	}
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionComplete,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: ex.Generation})
}

// recordEnd emits the event and metrics of an Execution whose final status was written.
func (r *ExecutionReconciler) recordEnd(ex *sandboxv1alpha1.Execution) {
	c := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
	if c == nil {
		return
	}
	evType := corev1.EventTypeNormal
	if ex.Status.Phase != sandboxv1alpha1.PhaseSucceeded {
		evType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(ex, nil, evType, c.Reason, "Finish", "%s: %s", ex.Status.Phase, c.Message)
	metrics.ExecutionsTotal.WithLabelValues(string(ex.Status.Phase)).Inc()
	metrics.EndToEnd.Observe(ex.Status.CompletionTime.Sub(ex.CreationTimestamp.Time).Seconds())
	if ex.Status.DurationMillis != nil {
		metrics.RunDuration.Observe(float64(*ex.Status.DurationMillis) / 1000)
	}
}

func (r *ExecutionReconciler) deletePod(ctx context.Context, pod *corev1.Pod) error {
	if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	return nil
}

// deleted stops the run of an Execution that was deleted while it ran and
// deletes its pod: the interrupted code's pod is suspect. There is no
// finalizer (it would cost two API writes per Execution and leave Executions
// stuck in deletion without the operator); if the manager misses the delete, the
// pool controller deletes pods claimed by Executions that no longer exist.
func (r *ExecutionReconciler) deleted(ctx context.Context, key types.NamespacedName) error {
	uid, ok := r.Runner.UIDOf(key.Namespace, key.Name)
	if !ok {
		return nil
	}
	r.Runner.Cancel(uid)
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabels{sandboxpod.LabelState: sandboxpod.StateBusy}); err != nil {
		return err
	}
	for i := range pods.Items {
		if claim.ClaimedBy(&pods.Items[i]) == uid {
			if err := r.deletePod(ctx, &pods.Items[i]); err != nil {
				return err
			}
		}
	}
	r.Runner.Forget(uid)
	return nil
}

// SetupWithManager registers the reconciler: Executions, the runner's
// wake-ups, pods (claimed ones wake their Execution, idle ones the queue) and pools.
func (r *ExecutionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("execution-controller")
	}
	if r.Resolver == nil {
		r.Resolver = runner.PodIPResolver{}
	}
	if r.Runner == nil {
		r.Runner = NewRunner(r.Keys)
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.Execution{}).
		WatchesRawSource(source.Channel(r.Runner.Events, &handler.EnqueueRequestForObject{})).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.podToExecutions)).
		Watches(&sandboxv1alpha1.SandboxPool{}, handler.EnqueueRequestsFromMapFunc(r.poolToExecutions)).
		Watches(&sandboxv1alpha1.Execution{}, handler.EnqueueRequestsFromMapFunc(r.nextOfSession)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Named("execution").
		Complete(r)
}

// NewRunner returns a runner whose wake-ups name Executions and whose calls
// carry tokens signed with keys.
func NewRunner(keys *agentauth.Keyring) *runner.Runner {
	return runner.New(keys, func(namespace, name string) event.GenericEvent {
		return event.GenericEvent{Object: &sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
	})
}

func (r *ExecutionReconciler) podToExecutions(ctx context.Context, o client.Object) []ctrl.Request {
	pod := o.(*corev1.Pod)
	pool := pod.Labels[sandboxpod.LabelPool]
	if pool == "" {
		return nil
	}
	if name := pod.Annotations[sandboxpod.AnnotationClaimedBy]; name != "" {
		return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}}}
	}
	if s := claim.Session(pod); s != "" {
		return r.waitingExecutions(ctx, pod.Namespace, pool, s, 1)
	}
	if !sandboxpod.IsIdle(pod) {
		return nil
	}
	return r.waitingExecutions(ctx, pod.Namespace, pool, "", 0)
}

// nextOfSession wakes the next Execution of a session when one ends: its pod
// may have been released before the end was visible in the cache.
func (r *ExecutionReconciler) nextOfSession(ctx context.Context, o client.Object) []ctrl.Request {
	ex := o.(*sandboxv1alpha1.Execution)
	if ex.Spec.Session == "" || !ex.Status.Phase.IsFinished() {
		return nil
	}
	return r.waitingExecutions(ctx, ex.Namespace, ex.Spec.PoolRef.Name, ex.Spec.Session, 1)
}

func (r *ExecutionReconciler) poolToExecutions(ctx context.Context, o client.Object) []ctrl.Request {
	return r.waitingExecutions(ctx, o.GetNamespace(), o.GetName(), "", 0)
}

// waitingExecutions returns the first waiting Executions of a pool (of one
// session, when given): only those can take a pod that just became free, so
// waking the whole queue is not needed. limit 0 wakes as many as the pool has idle pods.
func (r *ExecutionReconciler) waitingExecutions(ctx context.Context, namespace, pool, session string, limit int) []ctrl.Request {
	var list sandboxv1alpha1.ExecutionList
	if err := r.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{indexActive: pool}); err != nil {
		return nil
	}
	var waiting []*sandboxv1alpha1.Execution
	for i := range list.Items {
		ex := &list.Items[i]
		if isWaiting(ex) && (session == "" || ex.Spec.Session == session) {
			waiting = append(waiting, ex)
		}
	}
	sort.Slice(waiting, func(i, j int) bool { return fifoLess(waiting[i], waiting[j]) })
	if limit == 0 {
		var pods corev1.PodList
		if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{
			sandboxpod.LabelPool: pool, sandboxpod.LabelState: sandboxpod.StateIdle}); err != nil {
			return nil
		}
		// Session Executions may sit ahead of others in the queue without taking an idle pod.
		limit = len(pods.Items) + 8
	}
	var out []ctrl.Request
	for _, ex := range waiting {
		if len(out) >= limit {
			break
		}
		out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ex.Namespace, Name: ex.Name}})
	}
	return out
}
