// Package session is the Session controller: a Session leases one warm pod
// of its pool for its whole life (lease.go), is watched while it holds it
// (check.go), ends Closed or Lost and frees its pod (end.go), may be
// suspended to a snapshot and resumed (suspend.go), and is deleted after
// its TTL (ttl.go). Reconcile (reconciler.go) routes between them; events.go
// says which changes wake which Session.
package session

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/membudget"
	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/tenancy"
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
	// restoreDeadline is how long a Ready Session that waits for its state
	// (a fork, a caller's restore) may wait: a fork is restored as soon as
	// it is Ready, within the data plane's two minutes to finish a fork.
	restoreDeadline = 5 * time.Minute
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
	Deps

	// statusWritten: when each Ready Session's activity was last written;
	// suspendFailed: when a Session whose suspend failed may be tried again.
	mu            sync.Mutex
	statusWritten map[types.UID]time.Time
	// seen: when the informer delivered each new Session that is not Ready
	// yet (metrics.SessionReady).
	seen          map[types.UID]time.Time
	suspendFailed map[types.UID]time.Time
	// moveBegun: when this process began each move still under way, to the
	// nanosecond (status.lastMove.startTime keeps seconds).
	moveBegun map[types.UID]time.Time
	// checkpoints are the loops that checkpoint durable Sessions (checkpoint.go).
	checkpoints *checkpointLoops
}

// Deps is what the Session reconciler is built with, besides its manager.
type Deps struct {
	// Gate opens a pod's agent for its Session (agentgate): only an agent
	// that speaks the manager's protocol, on the pool's pod the Session
	// holds under the UID it recorded.
	Gate *agentgate.Gate
	// Dispatcher is shared with the Execution reconciler: one queue per pool.
	Dispatcher *dispatch.Dispatcher
	// Tenancy says whether the Session's namespace may use its pool (a shared pool of another namespace).
	Tenancy *tenancy.Gate
	// Clock decides the time policies (nil: the wall clock).
	Clock clock.PassiveClock
	// Keys admit the pods a Session may lease (lease.Admits).
	Keys    lease.Keys
	Wakeups *wakeup.Source
	// Snapshots is the store suspended Sessions' state goes to; nil: no
	// Session is suspended (suspend.go).
	Snapshots *snapshotstore.Store
	// Memory admits suspends and resumes by the bytes they hold (nil: no bound).
	Memory *membudget.Budget
	// Nodes says which nodes are being drained: their Sessions move (move.go).
	Nodes *nodes.Tracker
}

// NewReconciler returns the Session reconciler: mgr's client, API reader and
// event recorder, and d.
func NewReconciler(mgr ctrl.Manager, d Deps) *Reconciler {
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	return &Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("session-controller"),
		Deps: d, statusWritten: map[types.UID]time.Time{}, seen: map[types.UID]time.Time{}, suspendFailed: map[types.UID]time.Time{},
		moveBegun: map[types.UID]time.Time{}, checkpoints: newCheckpointLoops()}
}

// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions/status,verbs=get;update;patch

// Reconcile moves a Session along Pending → Ready → Closed | Lost.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ses := &sandboxv1alpha1.Session{}
	if err := r.Get(ctx, req.NamespacedName, ses); err != nil {
		// Deleted: the pool controller frees a pod whose Session is gone.
		if apierrors.IsNotFound(err) {
			r.stopCheckpoints(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	switch {
	case ses.DeletionTimestamp != nil:
		r.stopCheckpoints(req.NamespacedName)
		r.mu.Lock()
		delete(r.moveBegun, ses.UID)
		r.mu.Unlock()
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

// nextCheck is when a Session just leased is looked at first: nothing else
// wakes it (its own Ready status does not, needsALook), so whatever falls
// due first, its idle timeout, its maximum lifetime or its suspend.
func (r *Reconciler) nextCheck(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, now time.Time) time.Duration {
	next := min(sessionCheckInterval, idleTimeout(ses, pool))
	if m := ses.Spec.MaxLifetime; m != nil {
		next = min(next, m.Duration)
	}
	if due, suspends := r.suspendDue(ses, pool, ses.Status.LastActivityTime, now); suspends {
		next = min(next, max(due, 0)+10*time.Millisecond)
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

func (r *Reconciler) setReady(ses *sandboxv1alpha1.Session, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ses.Status.Conditions, metav1.Condition{Type: sandboxv1alpha1.SessionConditionReady,
		Status: status, Reason: reason, Message: msg, ObservedGeneration: ses.Generation})
	ses.Status.ObservedGeneration = ses.Generation
}
