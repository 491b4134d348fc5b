// Package execution is the Execution controller: it gives a waiting
// Execution a free pod of its pool, runs its code there and stores how it
// ended. One file per concern: pending.go (waiting, claiming a pod,
// starting), session.go (Executions that name a Session), running.go
// (re-attaching, the reconciler's own deadline), finish.go (outcome to status,
// and the pod's fate), disposition.go (carrying out that fate after the
// status is stored), limits.go (what ended a run: a limit, the pod's end),
// ttl.go (deleting finished Executions), events.go (watches and wake-ups).
package execution

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/modelendpoint"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Reconciler runs Executions.
//
// The commit point: a final status is written, with what is to become of the
// pod, before anything irreversible happens to the pod. A manager that stops
// between any two writes finds, when it comes back, either a Running
// Execution (it asks the agent how the run ended) or a final status whose pod
// disposition it carries out.
type Reconciler struct {
	client.Client
	// APIReader reads around the cache, to confirm a lost pod or session before
	// failing an Execution for it: the pod informer can lag behind the Execution informer.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Deps

	// resets: the pods whose interpreter is being replaced for reuse (dispose).
	resets sync.Map
	// disposed: the Executions whose pod disposition was carried out.
	disposed recentlyDisposed
	// abandoned: Execution UID → the UID of the pod on a lost node its code
	// never reached (neverReached), never sent the code again.
	abandoned sync.Map
}

// Deps is what the Execution reconciler is built with, besides its manager.
type Deps struct {
	// Runner runs the Executions on the agents the gate opened for them.
	Runner *runner.Runner
	// Gate opens the agent of a pod for this Execution: the pod is its
	// pool's, built as the pool builds them, speaks the manager's protocol,
	// is claimed by the Execution and is the pod its status records.
	Gate *agentgate.Gate
	// Keys say whether the agent signing keys are loaded, and which are still held.
	Keys *agentauth.Keyring
	// Dispatcher decides which waiting Execution gets which free pod.
	Dispatcher *dispatch.Dispatcher
	// Tenancy says whether the Execution's namespace may use its pool (a shared pool of another namespace).
	Tenancy *tenancy.Gate
	// Nodes says which nodes stopped answering: a run on one is lost (running.go).
	Nodes *nodes.Tracker
	// Models answers the code's llm_query calls with the pool's ModelEndpoint.
	Models *modelendpoint.Endpoints
	// Clock is injected so the time policies are tested without sleeping
	// (nil: the wall clock).
	Clock clock.PassiveClock
	// Wakeups feeds the runner's and the dispatcher's wake-ups to the work queue.
	Wakeups *wakeup.Source
	// LeadingSince says since when this manager leads (false: not yet, or
	// unknown). Only an Execution created after that is claimed without a
	// Running status first (claimsAlone). Nil: none is.
	LeadingSince func() (time.Time, bool)
}

// NewReconciler returns the Execution reconciler: mgr's client, API reader
// and event recorder, and d.
func NewReconciler(mgr ctrl.Manager, d Deps) *Reconciler {
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	return &Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("execution-controller"), Deps: d}
}

// afterWrite is what a reconcile does once its status write succeeded: code
// is sent to an agent only on a status stored with the resourceVersion the
// reconcile read (Running, naming the pod). A reconcile working from a stale
// view of an Execution (after a failover or a watch that lagged) fails that
// write and so never runs code a second time.
type afterWrite struct {
	send *runner.Job
	// pool and pod are the send's: the gate opens the pod's agent for it
	// once the claim is stored.
	pool *sandboxv1alpha1.SandboxPool
	pod  *corev1.Pod
	// claim is the pod to claim before the send: a fresh claim, which the
	// send follows without a status write (runningStatusDelay).
	claim *corev1.Pod
}

// waitBackstop re-checks a waiting Execution in case a wake-up was missed.
const waitBackstop = 30 * time.Second

func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
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
	next := &afterWrite{}
	for attempt := 1; ; attempt++ {
		if job, started := r.Runner.Job(ex.UID); started && ex.Status.Phase != sandboxv1alpha1.PhaseRunning {
			// Started here on a fresh claim, its Running status not stored
			// (runningStatusDelay), or not in the cache yet.
			r.markRunning(ex, job.Pod, job.PodUID, metav1.NewTime(job.StartTime), job.CodeDigest)
		}
		if ex.Status.Phase == sandboxv1alpha1.PhaseRunning {
			result, err = r.reconcileRunning(ctx, ex, next)
		} else {
			result, err = r.reconcilePending(ctx, ex, next)
		}
		if next.claim == nil {
			break
		}
		// A fresh claim: it alone commits the run to the pod. The claim,
		// with the pod's resourceVersion as precondition, gives the pod to
		// one Execution; the Execution's UID on it is what a manager that
		// restarts finds the run by (reconcilePending, claimedPods); and the
		// runner remembers the run until the cache shows its final status,
		// so a reconcile from a view that lags never claims a second pod.
		// The Running status is written only for a run still under way
		// after runningStatusDelay: a short run writes its final status alone.
		pod, stored := next.claim, orig
		if !r.claimsAlone(ex) {
			// An Execution from before this manager led: a leader before it may
			// have started it, and this view of it may lag (a watch cache that
			// is behind after a failover). The Running status, written first
			// with the resourceVersion read, proves the view is current.
			ex.Status.ObservedGeneration = ex.Generation
			if perr := r.Status().Patch(ctx, ex, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); perr != nil {
				r.Dispatcher.ClaimFailed(ex.UID, pod.Name, "")
				if apierrors.IsConflict(perr) {
					return ctrl.Result{Requeue: true}, err // stale: nothing was sent
				}
				return ctrl.Result{}, errors.Join(err, fmt.Errorf("update status of execution %s: %w", ex.Name, perr))
			}
			stored = ex.DeepCopy()
		}
		if cerr := lease.Claim(ctx, r.Client, pod, ex.DeepCopy()); cerr != nil {
			logf.FromContext(ctx).V(4).Info("the claim did not commit; back in the queue", "pod", pod.Name, "err", cerr.Error())
			r.Dispatcher.ClaimFailed(ex.UID, pod.Name, pod.ResourceVersion)
			if stored != orig {
				return r.takeBack(ctx, ex, stored, pod)
			}
			if !apierrors.IsConflict(cerr) && !errors.Is(cerr, lease.ErrNotClaimable) {
				return ctrl.Result{}, cerr
			}
			// Lost a race (the cache was behind the pod): the next pod the
			// dispatcher gives is tried at once, not after a fixed delay.
			*ex, next = *orig.DeepCopy(), &afterWrite{}
			if attempt < maxClaimAttempts {
				continue
			}
			return ctrl.Result{Requeue: true}, nil
		}
		metrics.QueueWait.Observe(r.now().Sub(ex.CreationTimestamp.Time).Seconds())
		if res, err := r.send(ctx, ex, stored, next); err != nil || res != (ctrl.Result{}) {
			return res, err
		}
		if stored != orig {
			return result, err
		}
		return ctrl.Result{RequeueAfter: runningStatusDelay}, err
	}
	ex.Status.ObservedGeneration = ex.Generation
	if due, deferred := r.runningDeferred(orig, ex); deferred && next.send == nil {
		// Running, but for less than runningStatusDelay: nothing to write yet.
		*ex = *orig
		if result.RequeueAfter <= 0 || due < result.RequeueAfter {
			result.RequeueAfter = due
		}
		return result, err
	}
	// A run is sent (again, re-attaching after a restart) only after a write:
	// even when the status did not change, the resourceVersion precondition
	// proves this reconcile saw the latest one.
	if next.send != nil || !equality.Semantic.DeepEqual(orig.Status, ex.Status) {
		// The optimistic lock makes a reconcile that worked from a stale cache
		// fail here instead of overwriting a newer status (or starting code that
		// already ran).
		patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
		if perr := r.Status().Patch(ctx, ex, patch); perr != nil {
			if apierrors.IsConflict(perr) {
				// Stale: nothing was sent.
				return ctrl.Result{Requeue: true}, err
			}
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("update status of execution %s: %w", ex.Name, perr))
		}
		if next.send != nil {
			if res, err := r.send(ctx, ex, ex.DeepCopy(), next); err != nil || res != (ctrl.Result{}) {
				return res, err
			}
		}
		if !orig.Status.Phase.IsFinished() && ex.Status.Phase.IsFinished() {
			r.recordEnd(ex)
			// The final status is stored: now, and only now, the pod may change hands.
			if derr := r.dispose(ctx, ex); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}
	return result, err
}

// claimsAlone reports whether a fresh claim alone may commit ex's run, with
// no Running status written before the code is sent: ex was created after
// this manager became the leader (with a margin for the clocks of the API
// server and the manager), so no leader before it saw ex, and this
// manager's own runner remembers every run it started until the cache shows
// its final status.
func (r *Reconciler) claimsAlone(ex *sandboxv1alpha1.Execution) bool {
	if r.LeadingSince == nil {
		return false
	}
	since, ok := r.LeadingSince()
	return ok && ex.CreationTimestamp.After(since.Add(leadershipMargin))
}

// leadershipMargin covers the skew between the API server's clock (creation
// times, in whole seconds) and the manager's.
const leadershipMargin = time.Second

// takeBack puts an Execution whose claim did not commit back in the queue,
// taking back the Running status stored before the claim. Nothing was sent.
func (r *Reconciler) takeBack(ctx context.Context, ex, stored *sandboxv1alpha1.Execution, pod *corev1.Pod) (ctrl.Result, error) {
	r.unclaimed(ex, fmt.Sprintf("pod %s was taken by another Execution before this one's claim: back in the queue", pod.Name))
	if err := r.Status().Patch(ctx, ex, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); err != nil {
		// Running stays stored for a pod it does not hold; reconcileRunning undoes it.
		return ctrl.Result{Requeue: true}, fmt.Errorf("take back the Running status of execution %s: %w", ex.Name, err)
	}
	r.refreshPod(ctx, pod)
	return ctrl.Result{RequeueAfter: waitBackstop}, nil
}

// runningStatusDelay is how long a run started on a fresh claim goes before
// its Running status is written. Most runs end sooner, and write their final
// status alone: one write fewer per Execution. kubectl shows such an
// Execution Pending (or no phase) until it ends.
const runningStatusDelay = time.Second

// maxClaimAttempts bounds the claims one reconcile makes in a row.
const maxClaimAttempts = 3

// runningDeferred reports whether ex is Running in memory only (started
// here, its Running status not stored) for less than runningStatusDelay,
// and when that delay is up.
func (r *Reconciler) runningDeferred(orig, ex *sandboxv1alpha1.Execution) (time.Duration, bool) {
	if orig.Status.Phase == sandboxv1alpha1.PhaseRunning || ex.Status.Phase != sandboxv1alpha1.PhaseRunning || ex.Status.StartTime == nil {
		return 0, false
	}
	due := ex.Status.StartTime.Add(runningStatusDelay).Sub(r.now())
	return due, due > 0
}

// send starts the run once its status is stored: on the pod the gate
// opens for it, the pod as claimed (next.claim, written with the status) or
// as read. A pod the gate refuses gets nothing; the Execution goes back to
// the queue (its code never left).
func (r *Reconciler) send(ctx context.Context, ex, stored *sandboxv1alpha1.Execution, next *afterWrite) (ctrl.Result, error) {
	pod := next.pod
	if next.claim != nil {
		pod = next.claim
	}
	agent, err := r.Gate.Open(ctx, next.pool, pod, agentgate.ForExecution(ex))
	if err != nil {
		logf.FromContext(ctx).Info("the gate refused the pod: back in the queue", "pod", pod.Name, "err", err.Error())
		r.Recorder.Eventf(ex, pod, corev1.EventTypeWarning, sandboxv1alpha1.ReasonSandboxRefused, "Send",
			"pod %s: %v; the code was not sent", pod.Name, err)
		r.Dispatcher.ClaimFailed(ex.UID, pod.Name, pod.ResourceVersion)
		r.unclaimed(ex, fmt.Sprintf("pod %s could not be given the code (%v): back in the queue", pod.Name, err))
		if perr := r.Status().Patch(ctx, ex, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); perr != nil {
			// Running stays stored without a run; reconcileRunning finds no outcome and sends it again through the gate.
			return ctrl.Result{Requeue: true}, fmt.Errorf("take back the Running status of execution %s: %w", ex.Name, perr)
		}
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	job := *next.send
	job.Agent = agent
	// Only a fresh claim's send is the code's first: any other (a claim
	// found after a restart, a run the agent did not know) may follow a send
	// of an earlier manager.
	job.Fresh = next.claim != nil
	r.Runner.Start(job)
	return ctrl.Result{}, nil
}

// refreshPod tells the dispatcher the pod as it is now: it took the pod for
// busy when it saw a Running status that named it.
func (r *Reconciler) refreshPod(ctx context.Context, pod *corev1.Pod) {
	live := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), live); err == nil {
		r.Dispatcher.UpdatePod(live)
	}
}

// reconcileFinished carries out the pod disposition if that did not happen
// yet (the manager stopped just after the final status), then applies the TTL.
func (r *Reconciler) reconcileFinished(ctx context.Context, ex *sandboxv1alpha1.Execution) (ctrl.Result, error) {
	// A reconcile from a stale view may have queued it again (Place); forget it.
	r.Dispatcher.UpdateExecution(ex)
	if err := r.dispose(ctx, ex); err != nil {
		return ctrl.Result{}, err
	}
	r.Runner.Forget(ex.UID)
	r.abandoned.Delete(ex.UID)
	return r.applyTTL(ctx, ex)
}

// waiting records that the Execution waits for a pod.
func (r *Reconciler) waiting(ex *sandboxv1alpha1.Execution, reason, msg string) {
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionWaitingForSandbox,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: ex.Generation})
}

// end sets a final phase with its Complete condition, and what becomes of the pod.
func (r *Reconciler) end(ex *sandboxv1alpha1.Execution, phase sandboxv1alpha1.ExecutionPhase, reason, msg string,
	execErr *sandboxv1alpha1.ExecutionError, pod sandboxv1alpha1.PodDisposition) {
	now := metav1.NewTime(r.Clock.Now())
	ex.Status.Phase = phase
	ex.Status.CompletionTime = &now
	ex.Status.PodDisposition = pod
	if execErr != nil {
		ex.Status.Error = execErr
	}
	if c := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox); c != nil && c.Status == metav1.ConditionTrue {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, reason, "no longer waiting: "+string(phase)
	}
	meta.SetStatusCondition(&ex.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.ExecutionConditionComplete,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: ex.Generation})
}

// fail ends the Execution Failed for an operator reason, with that reason as its error.
func (r *Reconciler) fail(ex *sandboxv1alpha1.Execution, reason, msg string, pod sandboxv1alpha1.PodDisposition) {
	r.end(ex, sandboxv1alpha1.PhaseFailed, reason, msg, &sandboxv1alpha1.ExecutionError{Type: reason, Message: msg}, pod)
}

// recordEnd emits the event and metrics of an Execution whose final status was written.
func (r *Reconciler) recordEnd(ex *sandboxv1alpha1.Execution) {
	c := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
	if c == nil {
		return
	}
	if ex.Status.Phase != sandboxv1alpha1.PhaseSucceeded {
		// What went wrong is an Event; a success is its status alone (the
		// Complete condition says the same): an Event per Execution was one
		// API write in six of the manager's.
		r.Recorder.Eventf(ex, nil, corev1.EventTypeWarning, c.Reason, "Finish", "%s: %s", ex.Status.Phase, c.Message)
	}
	metrics.ExecutionsTotal.WithLabelValues(string(ex.Status.Phase), c.Reason).Inc()
	if cause := interruptCause(ex); cause != "" {
		metrics.ExecutionInterrupts.WithLabelValues(cause).Inc()
	}
	if cause := killCause(ex, c.Reason); cause != "" {
		metrics.ExecutionKills.WithLabelValues(cause).Inc()
	}
	metrics.EndToEnd.Observe(ex.Status.CompletionTime.Sub(ex.CreationTimestamp.Time).Seconds())
	if ex.Status.DurationMillis != nil {
		metrics.RunDuration.Observe(float64(*ex.Status.DurationMillis) / 1000)
	}
}

// interruptCause says why the code of a finished Execution was interrupted,
// if it was: only started code is (a cancelled pending one never ran).
func interruptCause(ex *sandboxv1alpha1.Execution) string {
	if ex.Status.StartTime == nil {
		return ""
	}
	switch ex.Status.Phase {
	case sandboxv1alpha1.PhaseTimedOut:
		return "timeout"
	case sandboxv1alpha1.PhaseCancelled:
		return "cancel"
	}
	return ""
}

// killCause says why a finished Execution's interpreter was killed, if it was.
func killCause(ex *sandboxv1alpha1.Execution, reason string) string {
	switch {
	case ex.Status.Error != nil && ex.Status.Error.Type == protocol.ErrorInterpreterKilled:
		return "interrupt_ignored"
	case reason == sandboxv1alpha1.ReasonOOMKilled || reason == sandboxv1alpha1.ReasonMemoryLimitExceeded:
		return "memory"
	case ex.Status.Phase == sandboxv1alpha1.PhaseTimedOut && ex.Status.Error != nil && ex.Status.Error.Type == sandboxv1alpha1.ReasonTimedOut:
		// finish names the error after the reason only when the agent gave
		// no result: it could not stop the code, and the pod goes.
		return "unresponsive"
	}
	return ""
}

// deleted stops the run of an Execution that was deleted while it ran and
// deletes its pod: the interrupted code's pod is suspect. There is no
// finalizer (it would cost two API writes per Execution and leave Executions
// stuck in deletion without the operator); if the manager misses the delete, the
// pool controller deletes pods claimed by Executions that no longer exist.
func (r *Reconciler) deleted(ctx context.Context, key types.NamespacedName) error {
	uid, ok := r.Runner.UIDOf(key.Namespace, key.Name)
	if !ok {
		return nil
	}
	r.Runner.Cancel(uid)
	pods, err := r.claimedPods(ctx, key.Namespace, uid)
	if err != nil {
		return err
	}
	for _, pod := range pods { // only a pod its pool owns is deleted
		if err := r.deleteClaimedPod(ctx, pod, uid); err != nil {
			return err
		}
	}
	r.Runner.Forget(uid)
	return nil
}

// now is the injected clock's time.
func (r *Reconciler) now() time.Time { return r.Clock.Now() }
