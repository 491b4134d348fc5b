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
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// lease gets the Session a pod: the one already labelled with its name, or
// the one the dispatcher chose. A plain Session (no context, env or
// snapshot to apply) writes its pod's claim and its Ready status at the same
// time, one write on the critical path (leaseAtOnce); one with something to
// apply claims first, applies it on the pod that is now its own, and then
// stores Ready. A manager that stops between the two writes leaves a
// labelled pod, which the next reconcile adopts, or a Ready status whose
// claim never landed, which check() writes again (the dispatcher keeps the
// pod a Ready status names from every other claim meanwhile).
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
	init, err := initRequest(ses)
	if err != nil {
		// Immutable: no pod is taken for a Session that can never be Ready.
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonContextFailed, err.Error())
	}
	// A claim that does not commit (the cache was behind the pod) is tried
	// again at once on the next pod the dispatcher gives, not after a delay:
	// a fixed wait would be paid by every Session that lost a race.
	for attempt := 1; ; attempt++ {
		res, retry, err := r.leaseOnce(ctx, ses, pool, init, start)
		if !retry {
			return res, err
		}
		if attempt == maxClaimAttempts {
			return ctrl.Result{RequeueAfter: claimRetry}, nil
		}
	}
}

// maxClaimAttempts bounds the claims one reconcile makes in a row.
const maxClaimAttempts = 3

// leaseOnce places the Session and tries to lease the pod it is given;
// retry: the claim did not commit, and the pod went back to the dispatcher.
func (r *Reconciler) leaseOnce(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	init *protocol.ExecuteRequest, start time.Time) (res ctrl.Result, retry bool, err error) {
	// A Session with a snapshot is resuming: it restores it on the pod it
	// leases, before its Ready status (suspend.go).
	resuming := ses.Status.Snapshot != nil
	log := logf.FromContext(ctx)
	pl := r.Dispatcher.PlaceSession(ses)
	if pl.Pod == "" && pl.SessionPod != "" {
		res, err := r.awaitOwnPod(ctx, ses, pl.SessionPod)
		return res, false, err
	}
	if claimed := dispatch.ClaimedPod(ses, time.Now()); pl.Pod == "" && claimed != "" {
		// The data plane claimed a pod for the Session's one-call run as it
		// created it: the pod's event brings it here (the dispatcher wakes
		// it), and nothing is written meanwhile.
		return ctrl.Result{RequeueAfter: time.Until(ses.CreationTimestamp.Add(dispatch.ClaimedPodGrace)) + 10*time.Millisecond}, false, nil
	}
	if pl.Pod == "" {
		res, err := r.noPod(ctx, ses, pool, pl, resuming)
		return res, false, err
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pl.Pod}, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, false, err
		}
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, "")
		return ctrl.Result{}, true, nil
	}
	if resuming && lease.Suspending(pod) {
		// The pod the Session was suspended from, still there: a move never
		// goes back to it (its node is drained); a resume adopts it, unless
		// its delete is under way, which a cache that lags may not show yet
		// (adopted, it would take the resumed Session down with it).
		if ses.Moving() {
			res, err := r.dropSealed(ctx, ses, pod)
			return res, false, err
		}
		live := &corev1.Pod{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), live); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, false, err
		} else if err != nil || live.UID != pod.UID || live.DeletionTimestamp != nil {
			r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
			return ctrl.Result{RequeueAfter: claimRetry}, false, nil
		}
	}
	if err := lease.MayServe(pool, pod, r.Keys); err != nil {
		log.Info("not claiming a pod that is not the pool's", "pod", pod.Name, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
		return ctrl.Result{}, true, nil
	}
	if err := r.Gate.Agents().Check(ctx, pod); err != nil {
		// Its pool replaces a pod whose agent the manager does not speak.
		log.Info("not claiming a pod whose agent cannot be called", "pod", pod.Name, "reason", err.Error())
		r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, pod.ResourceVersion)
		return ctrl.Result{}, true, nil
	}
	if init == nil && !resuming && !lease.HeldBy(pod, ses) {
		return r.leaseAtOnce(ctx, ses, pool, pod, start)
	}
	// Without a context or env to apply, the interpreter's tag is all the
	// Session needs from the agent, and asking for it changes nothing: ask
	// while the claim is written. A context is applied only to a pod that is
	// the Session's.
	// A resume reads its snapshot from the store while the claim is written:
	// the budget is taken first (a resume it cannot take claims nothing and
	// looks again), and bytes read for a claim that did not commit are
	// dropped, never restored.
	var snapshot chan fetched
	if resuming {
		hold, herr := r.Memory.Acquire("resume", ses.Namespace, resumeCost(ses.Status.Snapshot.Bytes))
		if herr != nil {
			r.Dispatcher.ClaimFailed(ses.UID, pl.Pod, "")
			res, err := r.budgetFull(ctx, ses, herr)
			return res, false, err
		}
		defer hold.Release()
		snapshot = make(chan fetched, 1)
		go func() { snapshot <- r.fetch(ctx, ses) }()
		defer func() {
			if snapshot != nil {
				<-snapshot // not used: the claim did not commit, or the agent failed first
			}
		}()
	}
	var tag chan error
	var interp string
	if init == nil {
		tag = make(chan error, 1)
		asked := pod.DeepCopy()
		go func() {
			var err error
			interp, err = r.interpreter(ctx, pool, asked)
			tag <- err
		}()
	}
	claimStart := time.Now()
	if err := lease.ClaimForSession(ctx, r.Client, pod, ses, r.Clock.Now()); err != nil {
		if tag != nil {
			<-tag
		}
		return r.claimDidNotCommit(ctx, ses, pl.Pod, pod.ResourceVersion, err)
	}
	claimed := time.Now()
	if tag != nil {
		err = <-tag
	} else {
		interp, err = r.initialize(ctx, ses, pool, pod, init)
	}
	interpreted, fetchedAt := time.Now(), time.Time{}
	if err == nil && resuming {
		f := <-snapshot
		snapshot = nil
		fetchedAt = time.Now()
		err = r.restore(ctx, ses, pod, f)
	}
	if err != nil {
		res, err := r.leaseFailed(ctx, ses, pod, resuming, err)
		return res, false, err
	}
	r.markReady(ses, pod, interp, resuming)
	tagged := time.Now()
	if err := r.Status().Update(ctx, ses); err != nil {
		if apierrors.IsConflict(err) {
			// The cache showed an older Session; the pod is its own now, and the
			// next look adopts it.
			return ctrl.Result{RequeueAfter: claimRetry}, false, nil
		}
		return ctrl.Result{}, false, fmt.Errorf("store Ready status of session %s: %w", ses.Name, err)
	}
	log.V(1).Info("leased", "pod", pod.Name, "placeMs", ms(claimStart.Sub(start)), "claimMs", ms(claimed.Sub(claimStart)),
		"interpreterMs", ms(interpreted.Sub(claimed)), "statusMs", ms(time.Since(tagged)), "resumed", resuming)
	if resuming {
		log.V(1).Info("resumed", "fetchWaitMs", ms(fetchedAt.Sub(interpreted)), "restoreMs", ms(tagged.Sub(fetchedAt)))
	}
	return r.leased(ctx, ses, pool, pod, start, resuming), false, nil
}

// leaseAtOnce leases a pod to a plain Session with one write on the critical
// path: the claim is sent first, the Ready status as soon as the agent said
// which interpreter runs, without waiting for the claim's answer.
//
// Why this keeps the commit point: the claim, with the pod's
// resourceVersion as precondition, is still what gives the pod to one
// Session alone, and nothing runs on a pod before it shows the claim (the
// data plane and the Executions run only on a pod that carries the
// Session's lease, agentgate). A Ready status whose claim did not commit
// names a pod the Session does not hold: the claim is written again on the
// pod as it is now, and if someone else holds it the status is taken back
// (unready) before anything could run. A manager that stops in between
// leaves a Ready status without its claim: the dispatcher keeps that pod
// for the Session and check() writes the claim (claimNamedPod).
func (r *Reconciler) leaseAtOnce(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, start time.Time) (ctrl.Result, bool, error) {
	log := logf.FromContext(ctx)
	if !lease.ClaimableForSession(pod, ses) {
		// The cache already shows the pod taken (its event came after the
		// dispatcher gave it): no Ready status for a claim that cannot commit,
		// which a caller could see before it is taken back.
		return r.claimDidNotCommit(ctx, ses, pod.Name, pod.ResourceVersion, lease.ErrNotClaimable)
	}
	toClaim := pod.DeepCopy()
	claimDone := make(chan error, 1)
	go func() { claimDone <- lease.ClaimForSession(ctx, r.Client, toClaim, ses, r.Clock.Now()) }()
	interp, err := r.interpreter(ctx, pool, pod)
	interpreted := time.Now()
	if err != nil {
		if cerr := <-claimDone; cerr != nil {
			return r.claimDidNotCommit(ctx, ses, pod.Name, pod.ResourceVersion, cerr)
		}
		res, err := r.leaseFailed(ctx, ses, toClaim, false, err)
		return res, false, err
	}
	before := ses.Status.DeepCopy()
	r.markReady(ses, pod, interp, false)
	werr := r.Status().Update(ctx, ses)
	stored := time.Now()
	cerr := <-claimDone
	switch {
	case werr != nil && cerr != nil:
		_, _, err := r.claimDidNotCommit(ctx, ses, pod.Name, pod.ResourceVersion, cerr)
		if apierrors.IsConflict(werr) {
			// The Session changed since it was read: look again at the new one.
			return ctrl.Result{Requeue: true}, false, err
		}
		return ctrl.Result{}, false, errors.Join(err, fmt.Errorf("store Ready status of session %s: %w", ses.Name, werr))
	case werr != nil && apierrors.IsConflict(werr):
		// The cache showed an older Session; the pod is its own now, and the
		// next look adopts it.
		return ctrl.Result{RequeueAfter: claimRetry}, false, nil
	case werr != nil:
		return ctrl.Result{}, false, fmt.Errorf("store Ready status of session %s: %w", ses.Name, werr)
	case cerr != nil:
		held, err := r.claimNamedPod(ctx, ses)
		if err != nil {
			return ctrl.Result{}, false, err
		}
		if !held {
			log.V(1).Info("the claim did not commit after the Ready status; taking it back", "pod", pod.Name, "err", cerr.Error())
			if err := r.unready(ctx, ses, pod.Name, before); err != nil {
				return ctrl.Result{}, false, err
			}
			r.Dispatcher.ClaimFailed(ses.UID, pod.Name, pod.ResourceVersion)
			return ctrl.Result{}, true, nil
		}
	}
	log.V(1).Info("leased", "pod", pod.Name, "placeMs", ms(interpreted.Sub(start)), "statusMs", ms(stored.Sub(interpreted)),
		"claimMs", ms(time.Since(interpreted)), "atOnce", true)
	return r.leased(ctx, ses, pool, toClaim, start, false), false, nil
}

// claimDidNotCommit gives the pod back to the dispatcher; retry: the claim
// lost a race (the cache was behind the pod), and another pod may be tried.
func (r *Reconciler) claimDidNotCommit(ctx context.Context, ses *sandboxv1alpha1.Session, pod, rv string, err error) (ctrl.Result, bool, error) {
	logf.FromContext(ctx).V(1).Info("the claim did not commit", "pod", pod, "err", err.Error())
	r.Dispatcher.ClaimFailed(ses.UID, pod, rv)
	if !apierrors.IsConflict(err) && !errors.Is(err, lease.ErrNotClaimable) {
		return ctrl.Result{}, false, err // the pod goes back to the queue meanwhile
	}
	return ctrl.Result{}, true, nil
}

// claimNamedPod writes the lease's claim on the pod a Ready Session's status
// names, when the claim that went with the status did not land: the pod as
// it is now, if it is still free for the Session. held: the pod is the
// Session's now.
func (r *Reconciler) claimNamedPod(ctx context.Context, ses *sandboxv1alpha1.Session) (held bool, err error) {
	pod := &corev1.Pod{}
	for range 3 {
		if err := r.APIReader.Get(ctx, ses.PodKey(), pod); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if pod.UID != ses.Status.PodUID || !lease.ClaimableForSession(pod, ses) {
			return false, nil
		}
		if lease.HolderUID(pod, ses) == ses.UID {
			return true, nil
		}
		err := lease.ClaimForSession(ctx, r.Client, pod, ses, r.Clock.Now())
		if err == nil {
			return true, nil
		}
		if !apierrors.IsConflict(err) {
			return false, err
		}
	}
	return false, nil
}

// unready takes back a Ready status whose pod was never the Session's:
// nothing ran (nothing runs on a pod without the Session's claim), and the
// Session waits for another pod.
func (r *Reconciler) unready(ctx context.Context, ses *sandboxv1alpha1.Session, pod string, before *sandboxv1alpha1.SessionStatus) error {
	ses.Status = *before
	ses.Status.Phase = sandboxv1alpha1.SessionPending
	r.setReady(ses, metav1.ConditionFalse, sandboxv1alpha1.ReasonNoIdleSandbox, fmt.Sprintf(
		"pod %s was taken before this Session's claim of it was stored: waiting for another", pod))
	if err := r.Status().Update(ctx, ses); err != nil {
		return fmt.Errorf("take back the Ready status of session %s: %w", ses.Name, err)
	}
	return nil
}

// noPod records why the dispatcher has no pod for the Session yet.
func (r *Reconciler) noPod(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	pl dispatch.Placement, resuming bool) (ctrl.Result, error) {
	switch {
	case resuming:
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonResuming, fmt.Sprintf(
			"resuming: waiting for an idle pod of pool %s to restore its snapshot on", pool.Name))
	case pl.TenantLimit:
		p := tenancy.PolicyFor(pool, ses.Namespace)
		return r.pending(ctx, ses, sandboxv1alpha1.ReasonTenantLimitReached, fmt.Sprintf(
			"namespace %s holds as many pods (spec.sharing maxPods %d) or Sessions (maxSessions %d) of the shared pool %s as it may: waiting for one to be freed",
			ses.Namespace, p.MaxPods, p.MaxSessions, ses.Spec.PoolRef.String()))
	}
	return r.pending(ctx, ses, sandboxv1alpha1.ReasonNoIdleSandbox, fmt.Sprintf(
		"no idle pod in pool %s: queued in creation order while the pool adds pods", pool.Name))
}

// interpreter asks the pod's agent which interpreter runs: the tag the
// Session's runs are pinned to. Asking changes nothing on the pod, so it is
// asked while the claim is written.
func (r *Reconciler) interpreter(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (string, error) {
	h, err := r.Gate.Health(ctx, pool, pod)
	if err == nil && h.Interpreter == "" {
		err = fmt.Errorf("the agent did not say which interpreter runs")
	}
	if err != nil {
		return "", fmt.Errorf("ask the agent of pod %s for its interpreter: %w", pod.Name, err)
	}
	return h.Interpreter, nil
}

// leaseFailed ends, retries or hands on a lease whose pod is the Session's
// (its claim committed) but whose agent failed it.
func (r *Reconciler) leaseFailed(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, resuming bool, err error) (ctrl.Result, error) {
	var failed *initFailed
	var lost *snapshotLost
	switch {
	case errors.As(err, &lost):
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSnapshotLost, err.Error())
	case errors.As(err, new(*storeFailed)):
		// The pod is the Session's now and stays so; the next look adopts it and asks the store again.
		return ctrl.Result{}, err
	case resuming:
		// Never Lost for a pod: the state is in the snapshot, and another pod takes it.
		return r.discard(ctx, ses, pod, err)
	case errors.As(err, &failed):
		// The pod is the Session's now; a later reconcile frees it.
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonContextFailed, err.Error())
	case r.Clock.Since(claimedAt(pod)) >= sessionUnreachableGrace:
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSandboxLost, fmt.Sprintf(
			"the agent of pod %s did not answer for %s after the Session claimed it: %v", pod.Name, sessionUnreachableGrace, err))
	}
	// The agent may be restarting: the next reconcile adopts the pod, which
	// now carries the Session's name, and asks again.
	return ctrl.Result{}, err
}

// markReady sets the Ready status of a Session that holds pod.
func (r *Reconciler) markReady(ses *sandboxv1alpha1.Session, pod *corev1.Pod, interp string, resuming bool) {
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
		if mv := ses.Status.LastMove; mv != nil && mv.EndTime == nil {
			r.moved(ses, mv, pod, now)
			reason, msg = sandboxv1alpha1.ReasonMoved, fmt.Sprintf("moved from node %s (%s) to pod %s on node %s in %d ms, with its state (%d bytes, %d variables)",
				mv.FromNode, mv.Reason, pod.Name, mv.ToNode, mv.PauseMillis, ses.Status.Snapshot.Bytes, ses.Status.Snapshot.Variables)
			if ck := mv.Checkpoint; ck != nil {
				reason, msg = sandboxv1alpha1.ReasonRecovered, fmt.Sprintf(
					"recovered on pod %s (node %s) in %d ms after %s, from its checkpoint after run %d (taken %s): the runs after it are to be redone",
					pod.Name, mv.ToNode, mv.PauseMillis, mv.Reason, ck.Run, ck.Time.UTC().Format(time.RFC3339))
			}
		}
		ses.Status.Snapshot = nil
	}
	r.setReady(ses, metav1.ConditionTrue, reason, msg)
}

// leased records a lease whose Ready status is stored, and says when the
// Session is looked at next.
func (r *Reconciler) leased(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	pod *corev1.Pod, start time.Time, resuming bool) ctrl.Result {
	r.Dispatcher.UpdateSession(ses)
	metrics.SessionLease.Observe(time.Since(start).Seconds())
	r.mu.Lock()
	if t, ok := r.seen[ses.UID]; ok {
		metrics.SessionReady.Observe(time.Since(t).Seconds())
		delete(r.seen, ses.UID)
	}
	r.mu.Unlock()
	if resuming {
		metrics.SessionResume.Observe(time.Since(start).Seconds())
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, sandboxv1alpha1.ReasonResumed, "Resume", "Resumed on pod %s", pod.Name)
		r.resumed(ctx, ses)
	}
	r.keepCheckpoints(ctx, ses, pool, pod)
	return ctrl.Result{RequeueAfter: r.nextCheck(ses, pool, ses.Status.LastActivityTime.Time)}
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
	if ses.Moving() && lease.Suspending(pod) {
		return r.dropSealed(ctx, ses, pod)
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

// dropSealed deletes the pod a moving Session was suspended from instead of
// adopting it: it is on a drained node, its state is in the snapshot, and
// its suspend deletes it (free); this is for a delete that failed or that
// a cache that lags does not show. The pool makes another pod elsewhere.
//
// Both are read around the cache first, and the pod is deleted only as it
// was read: a view that lags may show a Session still Suspended that is
// Ready on this very pod again (adopted by a manager before this one), or a
// pod that a run of the Session has claimed since.
func (r *Reconciler) dropSealed(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod) (ctrl.Result, error) {
	live, now := &corev1.Pod{}, &sandboxv1alpha1.Session{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ses), now); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), live); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{RequeueAfter: claimRetry}, nil
		}
		return ctrl.Result{}, err
	}
	if now.Status.Phase != sandboxv1alpha1.SessionSuspended || now.Status.PodUID == live.UID || live.UID != pod.UID ||
		!lease.Suspending(live) || lease.ClaimedBy(live) != "" || !lease.HeldBy(live, now) {
		// The view lagged: not given again until the pod's cache shows it changed.
		r.Dispatcher.ClaimFailed(ses.UID, pod.Name, pod.ResourceVersion)
		return ctrl.Result{RequeueAfter: claimRetry}, nil
	}
	logf.FromContext(ctx).V(1).Info("not resuming on the pod the Session was suspended from; deleting it", "pod", pod.Name)
	if err := r.Delete(ctx, live, client.Preconditions{UID: &live.UID, ResourceVersion: &live.ResourceVersion}); err != nil &&
		!apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return ctrl.Result{}, fmt.Errorf("delete pod %s, which session %s was suspended from: %w", pod.Name, ses.Name, err)
	}
	// Not given again until its delete is seen: then the Session waits for a fresh pod.
	r.Dispatcher.ClaimFailed(ses.UID, pod.Name, pod.ResourceVersion)
	return ctrl.Result{RequeueAfter: claimRetry}, nil
}
