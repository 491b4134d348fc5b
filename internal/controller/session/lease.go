package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// lease gets the Session a pod: the one already labelled with its name, or
// the one the dispatcher chose. The claim and the Ready status are written
// one after the other; a manager that stops between them leaves a labelled
// pod, which the next reconcile adopts. The dispatcher knows that pod from
// the pod informer; should the informer lag behind it and a second pod be
// leased, the pool deletes the one the Ready Session does not name.
func (r *Reconciler) lease(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	start := time.Now() // a measurement (metrics.SessionLease), not a decision: not r.Clock
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonPoolNotFound, fmt.Sprintf(
			"SandboxPool %q not found in namespace %s: create it, or fix spec.poolRef", ses.Spec.PoolRef.Name, ses.PoolKey().Namespace))
	}
	if err := r.Tenancy.Admit(ctx, pool, ses.Namespace); err != nil {
		var refused *tenancy.Refusal
		if !errors.As(err, &refused) {
			return ctrl.Result{}, err
		}
		return r.pending(ctx, ses, refused.Reason, refused.Message)
	}
	// A Session with a snapshot is resuming: it restores it on the pod it
	// leases, before its Ready status (suspend.go).
	resuming := ses.Status.Snapshot != nil
	init, err := initRequest(ses)
	if err != nil {
		// Immutable: no pod is taken for a Session that can never be Ready.
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonContextFailed, err.Error())
	}
	log := logf.FromContext(ctx)
	pl := r.Dispatcher.PlaceSession(ses)
	if pl.Pod == "" && pl.SessionPod != "" {
		return r.awaitOwnPod(ctx, ses, pl.SessionPod)
	}
	if pl.Pod == "" && resuming {
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonResuming, fmt.Sprintf(
			"resuming: waiting for an idle pod of pool %s to restore its snapshot on", pool.Name))
	}
	if pl.Pod == "" && pl.TenantLimit {
		p := tenancy.PolicyFor(pool, ses.Namespace)
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonTenantLimitReached, fmt.Sprintf(
			"namespace %s holds as many pods (spec.sharing maxPods %d) or Sessions (maxSessions %d) of the shared pool %s as it may: waiting for one to be freed",
			ses.Namespace, p.MaxPods, p.MaxSessions, ses.Spec.PoolRef.String()))
	}
	if pl.Pod == "" {
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonNoIdleSandbox, fmt.Sprintf(
			"no idle pod in pool %s: queued in creation order while the pool adds pods", pool.Name))
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pl.Pod}, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, "")
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	}
	// Without a context or env to apply, the interpreter's tag is all the
	// Session needs from the agent, and asking for it changes nothing: ask
	// while the claim is written. A context is applied only to a pod that is
	// the Session's.
	var tag chan tagAnswer
	tagCtx, cancelTag := context.WithCancel(ctx)
	defer cancelTag()
	if init == nil {
		tag = make(chan tagAnswer, 1)
		go func(pod *corev1.Pod) {
			h, err := r.Gate.Health(tagCtx, pool, pod)
			if err == nil && h.Interpreter == "" {
				err = fmt.Errorf("the agent did not say which interpreter runs")
			}
			if err != nil {
				tag <- tagAnswer{err: fmt.Errorf("ask the agent of pod %s for its interpreter: %w", pod.Name, err)}
				return
			}
			tag <- tagAnswer{interp: h.Interpreter}
		}(pod.DeepCopy())
	}
	if err := lease.MayServe(pool, pod, r.Keys); err != nil {
		log.Info("not claiming a pod that is not the pool's", "pod", pod.Name, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	}
	if err := r.Gate.Agents().Check(ctx, pod); err != nil {
		// Its pool replaces a pod whose agent the manager does not speak.
		log.Info("not claiming a pod whose agent cannot be called", "pod", pod.Name, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	}
	claimStart := time.Now()
	if err := lease.ClaimForSession(ctx, r.Client, pod, ses, r.Clock.Now()); err != nil {
		log.V(1).Info("the claim did not commit", "pod", pod.Name, "err", err.Error())
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
		if !apierrors.IsConflict(err) && err != lease.ErrNotClaimable {
			return ctrl.Result{}, err // the pod goes back to the queue meanwhile
		}
		// A fixed short retry, not the rate limiter's: a cache that lags
		// behind a few claims must not push the Session out by minutes.
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	}
	claimed := time.Now()
	var interp string
	if tag != nil {
		a := <-tag
		interp, err = a.interp, a.err
	} else {
		interp, err = r.initialize(ctx, ses, pool, pod, init)
	}
	interpreted, fetchedAt := time.Now(), time.Time{}
	if err == nil && resuming {
		// Read from the store only now that the pod is the Session's: a
		// claim that did not commit reads nothing, and the snapshot is held
		// in memory only if the budget takes it (else the pod stays the
		// Session's, and the next look adopts it and tries again).
		hold, herr := r.Memory.Acquire("resume", ses.Namespace, resumeCost(ses.Status.Snapshot.Bytes))
		if herr != nil {
			return r.budgetFull(ctx, ses, herr)
		}
		f := r.fetch(ctx, ses)
		fetchedAt = time.Now()
		err = r.restore(ctx, ses, pod, f)
		hold.Release()
	}
	var failed *initFailed
	var lost *snapshotLost
	switch {
	case errors.As(err, &lost):
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSnapshotLost, err.Error())
	case errors.As(err, new(*storeFailed)):
		// The pod is the Session's now and stays so; the next look adopts it and asks the store again.
		return ctrl.Result{}, err
	case err != nil && resuming:
		// Never Lost for a pod: the state is in the snapshot, and another pod takes it.
		return r.discard(ctx, ses, pod, err)
	case errors.As(err, &failed):
		// The pod is the Session's now; a later reconcile frees it.
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonContextFailed, err.Error())
	case err != nil && r.Clock.Since(claimedAt(pod)) >= sessionUnreachableGrace:
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf(
			"the agent of pod %s did not answer for %s after the Session claimed it: %v", pod.Name, sessionUnreachableGrace, err))
	case err != nil:
		// The agent may be restarting: the next reconcile adopts the pod, which
		// now carries the Session's name, and asks again.
		return ctrl.Result{}, err
	}
	now := metav1.NewTime(r.Clock.Now())
	ses.Status.Phase = sandboxv1alpha1.SessionReady
	ses.Status.PodName, ses.Status.PodUID = pod.Name, pod.UID
	ses.Status.Interpreter = interp
	if ses.Status.ReadyTime == nil { // maxLifetime counts from the first time
		ses.Status.ReadyTime = &now
	}
	ses.Status.LastActivityTime = &now
	reason, msg := sandboxv1alpha1.ReasonSandboxClaimed, fmt.Sprintf("holds pod %s", pod.Name)
	if resuming {
		ses.Status.Resumes++
		reason, msg = sandboxv1alpha1.ReasonResumed, fmt.Sprintf("holds pod %s, resumed from its snapshot (%d bytes, %d variables)",
			pod.Name, ses.Status.Snapshot.Bytes, ses.Status.Snapshot.Variables)
		ses.Status.Snapshot = nil
	}
	r.setReady(ses, metav1.ConditionTrue, reason, msg)
	tagged := time.Now()
	if err := r.Status().Update(ctx, ses); err != nil {
		if apierrors.IsConflict(err) {
			// The cache showed an older Session; the pod is its own now, and the
			// next look adopts it.
			return ctrl.Result{RequeueAfter: claimRetry}, nil
		}
		return ctrl.Result{}, fmt.Errorf("store Ready status of session %s: %w", ses.Name, err)
	}
	r.Dispatcher.UpdateSession(ses)
	metrics.SessionLease.Observe(time.Since(start).Seconds())
	r.mu.Lock()
	waitMs := 0.0
	if t, ok := r.seen[ses.UID]; ok {
		waitMs = ms(start.Sub(t))
		metrics.SessionReady.Observe(time.Since(t).Seconds())
		delete(r.seen, ses.UID)
	}
	r.mu.Unlock()
	log.V(1).Info("leased", "pod", pod.Name, "placeMs", ms(claimStart.Sub(start)), "claimMs", ms(claimed.Sub(claimStart)),
		"interpreterMs", ms(interpreted.Sub(claimed)), "statusMs", ms(time.Since(tagged)), "resumed", resuming, "waitMs", waitMs)
	if resuming {
		log.V(1).Info("resumed", "fetchWaitMs", ms(fetchedAt.Sub(interpreted)), "restoreMs", ms(tagged.Sub(fetchedAt)))
	}
	if resuming {
		metrics.SessionResume.Observe(time.Since(start).Seconds())
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, reason, "Resume", "Resumed on pod %s", pod.Name)
		r.resumed(ctx, ses)
	}
	return ctrl.Result{RequeueAfter: r.nextCheck(ses, pool, now.Time)}, nil
}

// labelledPod returns a live pod of the Session's pool that is this
// Session's (its name and UID; a pod of an earlier Session of the same name
// is not).
func (r *Reconciler) labelledPod(ctx context.Context, ses *sandboxv1alpha1.Session) (*corev1.Pod, error) {
	var pods corev1.PodList
	pool := ses.PoolKey()
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(pool.Namespace), client.MatchingLabels{
		sandboxpod.LabelPool: pool.Name, sandboxpod.LabelSession: ses.Name}); err != nil {
		return nil, fmt.Errorf("list pods of session %s: %w", ses.Name, err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; lease.HeldBy(p, ses) && !sandboxpod.IsTerminal(p) && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, nil
}

// tagAnswer is the agent's answer to which interpreter runs.
type tagAnswer struct {
	interp string
	err    error
}

// initFailed: the agent ran the Session's context and env, and they failed.
// Asking again would fail again.
type initFailed struct{ msg string }

func (e *initFailed) Error() string { return e.msg }

// initRequest is the run that applies the Session's context and env, or nil
// when it has neither. A context that can never apply is an error.
func initRequest(ses *sandboxv1alpha1.Session) (*protocol.ExecuteRequest, error) {
	if ses.Spec.Context == nil && len(ses.Spec.Env) == 0 {
		return nil, nil
	}
	req := &protocol.ExecuteRequest{ID: "session-init-" + string(ses.UID), Code: "pass"}
	if ses.Spec.Context != nil {
		raw := []byte(*ses.Spec.Context)
		if ses.Spec.ContextFormat != sandboxv1alpha1.ContextJSON {
			raw, _ = json.Marshal(*ses.Spec.Context)
		} else if !json.Valid(raw) {
			return nil, fmt.Errorf("spec.context is not valid JSON (contextFormat: json); spec.context is immutable: create a new Session with valid JSON")
		}
		req.Context = raw
	}
	if len(ses.Spec.Env) > 0 {
		env := map[string]string{}
		for _, e := range ses.Spec.Env {
			env[e.Name] = e.Value
		}
		doc, _ := json.Marshal(env)
		lit, _ := json.Marshal(string(doc)) // a JSON string is a Python string literal
		req.Code = fmt.Sprintf("__import__('os').environ.update(__import__('json').loads(%s))", lit)
	}
	return req, nil
}

// initialize applies the Session's context and env to its interpreter and
// returns the interpreter's tag. Doing it again (after a restart between the
// claim and the status) is harmless: nothing of the Session ran yet.
func (r *Reconciler) initialize(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, init *protocol.ExecuteRequest) (string, error) {
	agent, err := r.Gate.Open(ctx, pool, pod, agentgate.ForSessionLease(ses, pod))
	if err != nil {
		return "", err
	}
	req := *init
	req.ID += "-" + pod.Name
	ctx, cancel := context.WithTimeout(ctx, sessionInitTimeout)
	defer cancel()
	res, err := agent.Execute(ctx, req)
	if err != nil {
		return "", fmt.Errorf("apply the session's context on pod %s: %w", pod.Name, err)
	}
	if res.Status != protocol.StatusSucceeded {
		msg := string(res.Status)
		if res.Error != nil {
			msg = res.Error.Type + ": " + res.Error.Message
		}
		return "", &initFailed{msg: "applying the session's context and env failed: " + msg}
	}
	return res.Interpreter, nil
}

// claimedAt is when the pod was leased (its last-used time, written with the
// claim), its creation if it says nothing.
func claimedAt(pod *corev1.Pod) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, pod.Annotations[sandboxpod.AnnotationLastUsed]); err == nil {
		return t
	}
	return pod.CreationTimestamp.Time
}

// awaitOwnPod handles a Session whose pod, leased before its status was
// stored, cannot be adopted yet: a run of the Session holds it, or it is not
// Ready. A pod that stays not Ready loses the Session.
func (r *Reconciler) awaitOwnPod(ctx context.Context, ses *sandboxv1alpha1.Session, name string) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	err := r.Get(ctx, types.NamespacedName{Namespace: ses.PoolKey().Namespace, Name: name}, pod)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	switch {
	case err != nil || sandboxpod.IsTerminal(pod):
		// The dispatcher hears of it and places the Session afresh.
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	case lease.ClaimedBy(pod) != "":
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonSessionBusy, fmt.Sprintf(
			"waiting to adopt pod %s, which carries the Session's name, until the run that holds it ends", name))
	}
	down := notReadyFor(pod, r.Clock.Now())
	if down >= sessionUnreachableGrace && ses.Status.Snapshot != nil {
		return r.discard(ctx, ses, pod, errors.New(podDown(pod, down, nil)))
	}
	if down >= sessionUnreachableGrace {
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSandboxLost, podDown(pod, down, nil))
	}
	res, err := r.pending(ctx, ses, sandboxv1alpha1.ReasonSessionPending, fmt.Sprintf(
		"waiting for pod %s, which carries the Session's name, to be Ready again", name))
	if err == nil {
		res.RequeueAfter = min(res.RequeueAfter, sessionUnreachableGrace-down+10*time.Millisecond)
	}
	return res, err
}
