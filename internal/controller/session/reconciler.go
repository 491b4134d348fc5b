// Package session is the Session controller: a Session leases one warm pod
// of its pool for its whole life and ends Closed or Lost (reconciler.go), and
// an ended Session is deleted after its TTL (ttl.go).
package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/controller/recycle"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// The session policy. A Session leases one warm pod of its pool for its
// whole life: it waits in the pool's queue with the pool's Executions (first
// come, first served), claims its pod with the same optimistic lock, applies
// its context and env once, and is Ready. Its runs (through the data plane,
// or as Executions naming it) write nothing to the API: the agent counts them
// and the reconciler reads the count and the last activity from the agent
// when it checks the idle timeout, and writes them at most every
// sessionStatusInterval. It ends Closed (idle timeout, maximum lifetime,
// spec.close) or Lost (its pod or its interpreter went away); that status is
// stored before its pod is freed.

const (
	// defaultSessionIdleTimeout applies when neither the Session nor its pool sets one.
	defaultSessionIdleTimeout = 10 * time.Minute
	// sessionCheckInterval bounds how long a Ready Session goes without a look
	// at its pod's agent (interpreter restarts are found this way).
	sessionCheckInterval = 15 * time.Second
	// sessionStatusInterval is the least time between two writes of a Ready
	// Session's run count and last activity.
	sessionStatusInterval = 10 * time.Second
	// sessionInitTimeout bounds applying a Session's context and env.
	sessionInitTimeout = 30 * time.Second
	// claimRetry is when a Session whose claim did not commit looks again.
	claimRetry = 100 * time.Millisecond
	// sessionUnreachableGrace is how long a Session's pod may stay not Ready,
	// or its agent unanswering, before the Session is Lost. It covers a
	// container restart after an OOM kill (found as InterpreterRestarted once
	// the agent answers again) and a few missed probes of a busy node.
	sessionUnreachableGrace = 30 * time.Second
)

// Reconciler leases pods to Sessions and ends them.
type Reconciler struct {
	client.Client
	// APIReader confirms, around the cache, what the cache may not show yet: a
	// pod already labelled with the Session's name, a pod that is gone.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Gate opens a pod's agent for its Session (agentgate): only an agent
	// that speaks the manager's protocol, on the pool's pod the Session
	// holds under the UID it recorded.
	Gate *agentgate.Gate
	// Dispatcher is shared with the Execution reconciler: one queue per pool.
	Dispatcher *dispatch.Dispatcher
	// Tenancy says whether the Session's namespace may use its pool (a shared pool of another namespace).
	Tenancy *tenancy.Gate
	Clock   clock.PassiveClock
	// Keys admit the pods a Session may lease (lease.Admits).
	Keys lease.Keys

	Wakeups *wakeup.Source
	// Snapshots is the store suspended Sessions' state goes to; nil: no
	// Session is suspended (suspend.go).
	Snapshots *snapshotstore.Store
	// statusWritten: when each Ready Session's activity was last written;
	// suspendFailed: when a Session whose suspend failed may be tried again.
	mu            sync.Mutex
	statusWritten map[types.UID]time.Time
	// seen: when the informer delivered each new Session that is not Ready
	// yet (metrics.SessionReady).
	seen          map[types.UID]time.Time
	suspendFailed map[types.UID]time.Time
}

// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions/status,verbs=get;update;patch

// Reconcile moves a Session along Pending → Ready → Closed | Lost.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ses := &sandboxv1alpha1.Session{}
	if err := r.Get(ctx, req.NamespacedName, ses); err != nil {
		// Deleted: the pool controller frees a pod whose Session is gone.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	switch {
	case ses.DeletionTimestamp != nil:
		return ctrl.Result{}, r.dropSnapshots(ctx, ses)
	case ses.Status.Phase.IsFinished():
		return r.finished(ctx, ses)
	case ses.Spec.Close:
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonClosed, "closed by spec.close")
	case ses.Status.Phase == sandboxv1alpha1.SessionSuspended:
		return r.suspended(ctx, ses)
	case ses.Status.PodName == "":
		return r.lease(ctx, ses)
	default:
		return r.check(ctx, ses)
	}
}

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
	// A resume reads its snapshot from the store while the pod is claimed.
	var snap <-chan fetched
	if resuming {
		fetchCtx, cancelFetch := context.WithCancel(ctx)
		defer cancelFetch()
		snap = r.fetch(fetchCtx, ses)
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
		f := <-snap
		fetchedAt = time.Now()
		err = r.restore(ctx, ses, pod, f)
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
	if t, ok := r.seen[ses.UID]; ok {
		metrics.SessionReady.Observe(time.Since(t).Seconds())
		delete(r.seen, ses.UID)
	}
	r.mu.Unlock()
	log.V(1).Info("leased", "pod", pod.Name, "placeMs", ms(claimStart.Sub(start)), "claimMs", ms(claimed.Sub(claimStart)),
		"interpreterMs", ms(interpreted.Sub(claimed)), "statusMs", ms(time.Since(tagged)), "resumed", resuming)
	if resuming {
		log.V(1).Info("resumed", "fetchWaitMs", ms(fetchedAt.Sub(interpreted)), "restoreMs", ms(tagged.Sub(fetchedAt)))
	}
	if resuming {
		metrics.SessionResume.Observe(time.Since(start).Seconds())
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, reason, "Resume", "Resumed on pod %s", pod.Name)
		r.resumed(ctx, ses)
	} else {
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, reason, "Lease", "Holds pod %s", pod.Name)
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

// notReadyFor is how long the kubelet has reported the pod not Ready (its
// probe of the agent failing); 0 for a Ready pod.
func notReadyFor(pod *corev1.Pod, now time.Time) time.Duration {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			return now.Sub(c.LastTransitionTime.Time)
		}
	}
	return 0
}

// podDown says why a Session's pod that stayed not Ready is given up: how
// long, the agent's silence, and what the kubelet knows (OOM kill, crash loop).
func podDown(pod *corev1.Pod, down time.Duration, agentErr error) string {
	msg := fmt.Sprintf("pod %s has not been Ready for %s", pod.Name, down.Round(time.Second))
	if agentErr != nil {
		msg += fmt.Sprintf(" and its agent does not answer (%v)", agentErr)
	}
	if why, whyMsg := podstatus.End(pod); why != "" {
		return whyMsg + "; " + msg
	}
	if reason, detail := podstatus.Trouble(pod); reason != "" {
		msg += fmt.Sprintf(" (%s: %s)", reason, detail)
	}
	return msg
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

// check watches a Ready Session: its pod, its interpreter, its idle timeout
// and its maximum lifetime.
func (r *Reconciler) check(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	now := r.Clock.Now()
	pod, gone, err := r.sessionPod(ctx, ses)
	if err != nil {
		return ctrl.Result{}, err
	}
	if gone.msg != "" {
		reason := sandboxv1alpha1.ReasonSandboxLost
		if gone.reason != "" {
			reason = gone.reason
		}
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, reason, gone.msg)
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil // deleted: the Session keeps its pod until it ends
	}
	if m := ses.Spec.MaxLifetime; m != nil && ses.Status.ReadyTime != nil && !now.Before(ses.Status.ReadyTime.Add(m.Duration)) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonMaxLifetime,
			fmt.Sprintf("reached its maximum lifetime of %s", m.Duration))
	}
	health, herr := r.health(ctx, ses, pool, pod)
	if herr == nil && health.Interpreter != "" && ses.Status.Interpreter != "" && health.Interpreter != ses.Status.Interpreter {
		why := health.LastEnd
		if why == "" {
			why = "killed at its memory limit, or it did not stop at an interrupt"
		}
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonInterpreterRestarted,
			"the interpreter was replaced ("+why+"): its state is gone")
	}
	down := notReadyFor(pod, now)
	if herr != nil && down >= sessionUnreachableGrace {
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, sandboxv1alpha1.ReasonSandboxLost, podDown(pod, down, herr))
	}
	last := ses.Status.LastActivityTime.DeepCopy()
	if t, err := time.Parse(time.RFC3339Nano, pod.Annotations[sandboxpod.AnnotationLastUsed]); err == nil && (last == nil || t.After(last.Time)) {
		last = &metav1.Time{Time: t}
	}
	runs, busy := ses.Status.Runs, lease.ClaimedBy(pod) != ""
	if herr == nil {
		// The agent's clock (or a compromised agent) must not keep a Session alive past now.
		if h := health.LastActivity; h != nil && (last == nil || h.After(last.Time)) {
			t := *h
			if t.After(now) {
				t = now
			}
			last = &metav1.Time{Time: t}
		}
		runs, busy = max(runs, health.Runs), busy || health.Busy > 0
	}
	idle := idleTimeout(ses, pool)
	due, suspends := r.suspendDue(ses, pool, last, now)
	switch {
	case r.Snapshots != nil && (lease.Suspending(pod) || herr == nil && health.Sealed):
		// A suspend that did not commit (the manager stopped, the store
		// failed): the seal decided it, whatever happened since.
		return r.suspend(ctx, ses, pod, last, runs)
	case herr == nil && health.Sealed:
		if agent, err := r.agent(ctx, ses, pod, agentgate.ForSession(ses)); err == nil {
			_ = agent.Unseal(ctx) // sealed by a manager that had a store; this one has none
		}
	case suspends && !busy && herr == nil && due <= 0 && now.Before(last.Add(idle)):
		return r.suspend(ctx, ses, pod, last, runs)
	}
	if last != nil && !busy && !now.Before(last.Add(idle)) {
		if herr != nil && now.Before(last.Add(idle+sessionUnreachableGrace)) {
			// Cannot ask the agent whether a data-plane run is under way: look
			// again soon, and close it anyway once an unanswering agent has had
			// its grace (no run can reach it either).
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonIdleTimeout,
			fmt.Sprintf("idle for %s (idleTimeout %s)", now.Sub(last.Time).Round(time.Second), idle))
	}
	if last != nil {
		// Stored to the second: compared to the second, or every look after
		// a run (the agent and the pod's annotation keep nanoseconds) would
		// write the Session again with what it already holds.
		t := last.Rfc3339Copy()
		last = &t
	}
	if (runs != ses.Status.Runs || !last.Equal(ses.Status.LastActivityTime)) && r.mayWriteActivity(ses.UID, now) {
		ses.Status.Runs, ses.Status.LastActivityTime = runs, last
		if err := r.Status().Update(ctx, ses); err != nil {
			return ctrl.Result{}, fmt.Errorf("store activity of session %s: %w", ses.Name, err)
		}
	}
	// A busy Session is looked at again within one idle timeout: its run may
	// end (an Execution's release wakes nobody) and the clock start then.
	next := min(sessionCheckInterval, idle)
	if last != nil && !busy {
		next = min(next, last.Add(idle).Sub(now)+10*time.Millisecond)
	}
	if suspends && !busy {
		next = min(next, due+10*time.Millisecond)
	}
	if m := ses.Spec.MaxLifetime; m != nil && ses.Status.ReadyTime != nil {
		next = min(next, ses.Status.ReadyTime.Add(m.Duration).Sub(now)+10*time.Millisecond)
	}
	if herr != nil {
		// An agent that does not answer is asked again when its grace ends
		// (or sooner: a pod that turns Ready again wakes the Session).
		next = min(next, max(sessionUnreachableGrace-down, time.Second))
	}
	return ctrl.Result{RequeueAfter: max(next, 10*time.Millisecond)}, nil
}

// sessionPod returns a Ready Session's pod, or why it is gone. A pod the
// cache does not show is looked up around it before the Session is lost.
func (r *Reconciler) sessionPod(ctx context.Context, ses *sandboxv1alpha1.Session) (*corev1.Pod, podGone, error) {
	key := ses.PodKey()
	pod := &corev1.Pod{}
	err := r.Get(ctx, key, pod)
	if err == nil && lease.HeldBy(pod, ses) && !sandboxpod.IsTerminal(pod) && pod.DeletionTimestamp == nil {
		return pod, podGone{}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, podGone{}, err
	}
	if err := r.APIReader.Get(ctx, key, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, podGone{msg: fmt.Sprintf("pod %s was deleted, and with it the session's state", key.Name)}, nil
		}
		return nil, podGone{}, err
	}
	switch {
	case ses.Status.PodUID != "" && pod.UID != ses.Status.PodUID:
		return nil, podGone{msg: fmt.Sprintf("pod %s was deleted, and with it the session's state (a pod now under its name is another one)", key.Name)}, nil
	case !lease.HeldBy(pod, ses):
		return nil, podGone{msg: fmt.Sprintf("pod %s no longer belongs to the session", key.Name)}, nil
	case sandboxpod.IsTerminal(pod):
		// Why it ended, when the kubelet said (the memory limit, an
		// eviction): its pool keeps an ended pod until this is stored.
		if why, msg := podstatus.End(pod); why != "" {
			return nil, podGone{reason: why, msg: msg + ", and with it the session's state"}, nil
		}
		if pod.DeletionTimestamp != nil {
			return nil, podGone{msg: fmt.Sprintf("pod %s is being deleted, and with it the session's state", key.Name)}, nil
		}
		reason, msg := podstatus.Trouble(pod)
		if reason == "" {
			reason, msg = string(pod.Status.Phase), pod.Status.Message
		}
		return nil, podGone{msg: fmt.Sprintf("pod %s stopped (%s: %s)", key.Name, reason, msg)}, nil
	}
	return pod, podGone{}, nil
}

// podGone says why a Session's pod is gone: msg, and a reason of its own
// when the pod said why it ended.
type podGone struct{ reason, msg string }

func (r *Reconciler) health(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (*protocol.Health, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	agent, err := r.Gate.Open(ctx, pool, pod, agentgate.ForSession(ses))
	if err != nil {
		return nil, err
	}
	h, err := agent.Ready(ctx)
	if err != nil {
		metrics.AgentErrors.WithLabelValues("health").Inc()
	}
	return h, err
}

// mayWriteActivity rations the writes of a Session's activity.
func (r *Reconciler) mayWriteActivity(uid types.UID, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.statusWritten[uid]; ok && now.Sub(t) < sessionStatusInterval {
		return false
	}
	r.statusWritten[uid] = now
	return true
}

func idleTimeout(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool) time.Duration {
	switch {
	case ses.Spec.IdleTimeout != nil:
		return ses.Spec.IdleTimeout.Duration
	case pool != nil && pool.Spec.SessionIdleTimeout != nil:
		return pool.Spec.SessionIdleTimeout.Duration
	}
	return defaultSessionIdleTimeout
}

func (r *Reconciler) nextCheck(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, now time.Time) time.Duration {
	next := min(sessionCheckInterval, idleTimeout(ses, pool))
	if m := ses.Spec.MaxLifetime; m != nil {
		next = min(next, m.Duration)
	}
	return next
}

// waitBackstop re-checks a waiting Session in case a wake-up was missed.
const waitBackstop = 30 * time.Second

// pending records why a Session has no pod yet; the dispatcher wakes it when
// one frees up, and the backstop covers a pool that appears later.
func (r *Reconciler) pending(ctx context.Context, ses *sandboxv1alpha1.Session, reason, msg string) (ctrl.Result, error) {
	c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady)
	if ses.Status.Phase == sandboxv1alpha1.SessionPending && c != nil && c.Reason == reason && c.Message == msg {
		return ctrl.Result{RequeueAfter: waitBackstop}, nil
	}
	ses.Status.Phase = sandboxv1alpha1.SessionPending
	r.setReady(ses, metav1.ConditionFalse, reason, msg)
	if err := r.Status().Update(ctx, ses); err != nil {
		return ctrl.Result{}, fmt.Errorf("store Pending status of session %s: %w", ses.Name, err)
	}
	return ctrl.Result{RequeueAfter: waitBackstop}, nil
}

// end stores a final phase, then frees the pod: the status is the commit point.
func (r *Reconciler) end(ctx context.Context, ses *sandboxv1alpha1.Session, phase sandboxv1alpha1.SessionPhase, reason, msg string) (ctrl.Result, error) {
	ses.Status.Phase = phase
	now := metav1.NewTime(r.Clock.Now())
	ses.Status.EndTime = &now
	ses.Status.Snapshot = nil // deleted from the store with the finalizer (finished)
	r.setReady(ses, metav1.ConditionFalse, reason, msg)
	if err := r.Status().Update(ctx, ses); err != nil {
		return ctrl.Result{}, fmt.Errorf("store %s status of session %s: %w", phase, ses.Name, err)
	}
	r.mu.Lock()
	delete(r.statusWritten, ses.UID)
	r.mu.Unlock()
	r.Dispatcher.UpdateSession(ses)
	evType := corev1.EventTypeNormal
	if phase == sandboxv1alpha1.SessionLost {
		evType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(ses, nil, evType, reason, string(phase), "Session %s: %s", phase, msg)
	metrics.SessionsEnded.WithLabelValues(string(phase), reason).Inc()
	return r.free(ctx, ses)
}

// free gives an ended Session's pod back to its pool, deleted or reset per
// the pool's reusePolicy. A pod an Execution of the Session still runs on is
// left to that Execution's own timeout, then freed.
func (r *Reconciler) free(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	pod, err := r.labelledPod(ctx, ses)
	if err != nil || pod == nil {
		return ctrl.Result{}, err
	}
	if lease.ClaimedBy(pod) != "" {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	reuse := r.Get(ctx, ses.PoolKey(), pool) == nil &&
		pool.Spec.ReusePolicy == sandboxv1alpha1.ReuseFreshInterpreter &&
		(ses.Status.Phase == sandboxv1alpha1.SessionClosed || ses.Status.Phase == sandboxv1alpha1.SessionSuspended)
	// An Execution of the Session that was given the pod just before the
	// Session ended may claim it meanwhile: look again when it is done.
	held := false
	if reuse {
		released := false
		if err := recycle.RetryPodUpdate(ctx, r.APIReader, pod, func(p *corev1.Pod) error {
			held = lease.ClaimedBy(p) != ""
			err := lease.ReleaseSessionForReset(ctx, r.Client, p, ses, r.Clock.Now())
			released = err == nil && lease.Session(p) == ""
			return err
		}); err != nil {
			return ctrl.Result{}, err
		}
		if released {
			go recycle.Pod(logf.FromContext(ctx).WithValues("pod", pod.Name), r.Client, r.APIReader, r.Gate,
				client.ObjectKeyFromObject(pod), pod.UID)
		}
	} else {
		err = recycle.RetryPodUpdate(ctx, r.APIReader, pod, func(p *corev1.Pod) error {
			if held = lease.ClaimedBy(p) != ""; !lease.HeldBy(p, ses) || held {
				return nil
			}
			err := r.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete pod %s of session %s: %w", p.Name, ses.Name, err)
			}
			return nil
		})
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	if held {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) setReady(ses *sandboxv1alpha1.Session, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ses.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.SessionConditionReady,
		Status: status, Reason: reason, Message: msg, ObservedGeneration: ses.Generation})
	ses.Status.ObservedGeneration = ses.Generation
}

// sessionWorkers is how many Sessions are reconciled at once.
const sessionWorkers = 16

// SetupWithManager registers the reconciler. Session events feed the
// dispatcher; the dispatcher wakes a Session it chose a pod for; a change of
// a Session's pod wakes the Session (lost, released by an Execution).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("session-controller")
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.statusWritten = map[types.UID]time.Time{}
	r.seen = map[types.UID]time.Time{}
	r.suspendFailed = map[types.UID]time.Time{}
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.Session{}).
		WatchesRawSource(r.Wakeups).
		Watches(&sandboxv1alpha1.Session{}, r.sessionEvents()).
		Watches(&corev1.Pod{}, sessionPodEvents()).
		// Leases and checks call agents (up to 5 s for a health check): a few
		// slow sandboxes must not hold up every other Session. A lease waits
		// on two writes and an agent, not on CPU: at 75 new Sessions a second
		// four workers queued them for seconds (docs/scale.md).
		WithOptions(controller.Options{MaxConcurrentReconciles: sessionWorkers}).
		Named("session").
		Complete(r)
}

// sessionPodEvents wakes a Session when its pod changes in a way it must act
// on: the pod went away, stopped, changed readiness or lost the Session's
// label. The claims and releases of the Session's Executions do not: they
// come with every run, and the idle timeout reads their last one when it is
// due.
func sessionPodEvents() handler.TypedEventHandler[client.Object, ctrl.Request] {
	enqueue := func(pod client.Object, q wakeup.Queue) {
		if p, ok := pod.(*corev1.Pod); ok && lease.Session(p) != "" {
			// The Session is in the namespace whose code the pod runs (a shared pool's pods are elsewhere).
			q.Add(ctrl.Request{NamespacedName: types.NamespacedName{Namespace: lease.Tenant(p), Name: lease.Session(p)}})
		}
	}
	return handler.Funcs{
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q wakeup.Queue) {
			old, cur, ok := podPair(e)
			if !ok {
				return
			}
			switch {
			case lease.Session(old) != lease.Session(cur):
				// The Session that lost the pod must know. The one that gained it
				// claimed it itself and writes its status next: a reconcile now
				// would read it from a cache that has not seen that status yet
				// and lease again.
				enqueue(old, q)
			case cur.DeletionTimestamp != nil || sandboxpod.IsTerminal(cur) || sandboxpod.IsReady(old) != sandboxpod.IsReady(cur):
				enqueue(cur, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q wakeup.Queue) { enqueue(e.Object, q) },
	}
}

func podPair(e event.UpdateEvent) (old, cur *corev1.Pod, ok bool) {
	old, ok1 := e.ObjectOld.(*corev1.Pod)
	cur, ok2 := e.ObjectNew.(*corev1.Pod)
	return old, cur, ok1 && ok2
}

// sessionEvents feeds the dispatcher and enqueues nothing (For does).
func (r *Reconciler) sessionEvents() handler.TypedEventHandler[client.Object, ctrl.Request] {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ wakeup.Queue) {
			ses := e.Object.(*sandboxv1alpha1.Session)
			r.Dispatcher.UpdateSession(ses)
			if ses.Status.Phase == "" && ses.DeletionTimestamp == nil {
				r.mu.Lock()
				r.seen[ses.UID] = time.Now() // a measurement (metrics.SessionReady), not a decision
				r.mu.Unlock()
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ wakeup.Queue) {
			r.Dispatcher.UpdateSession(e.ObjectNew.(*sandboxv1alpha1.Session))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ wakeup.Queue) {
			if ses, ok := e.Object.(*sandboxv1alpha1.Session); ok {
				r.Dispatcher.DeleteSession(ses)
				r.mu.Lock()
				delete(r.statusWritten, ses.UID) // a Session deleted while Ready
				delete(r.seen, ses.UID)
				r.mu.Unlock()
			}
		},
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
