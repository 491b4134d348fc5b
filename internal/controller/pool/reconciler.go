// Package pool is the SandboxPool controller: it keeps spec.replicas idle
// Ready pods per pool plus one for each Execution waiting for a fresh pod,
// within spec.maxPods, with the pool's NetworkPolicy and PodDisruptionBudget.
// One file per policy: autoscale.go (replicas from the claim rate),
// isolation.go (the NetworkPolicy and the PDB), limits.go (quota and maxPods
// held, ScalingLimited), startfailures.go (pods that fail before they run
// code, Degraded, backoff), expectations.go (creates and deletes not yet seen
// by the cache).
package pool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/agentcheck"
	"github.com/warmpool/warmpool/internal/autoscale"
	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/controller/recycle"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// maxCreatesPerReconcile bounds one reconcile's burst of pod creations.
const maxCreatesPerReconcile = 50

// maxSurge bounds, when spec.maxPods is unset, the pods started for waiting
// Executions beyond spec.replicas: unclaimed pods (warming or idle) a burst
// asks for. As they are claimed, more start.
const maxSurge = 20

// Reconciler keeps spec.replicas idle Ready pods per pool, plus one
// for each Execution waiting for a pod, within spec.maxPods.
type Reconciler struct {
	client.Client
	// APIReader confirms, around the cache, that an Execution is gone before its pod is deleted.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Deps

	expectations *expectations

	mu sync.Mutex
	// readySeen: per pool, the pods seen Ready (their start latency observed
	// once); rebuilt on every reconcile, so deleted pods drop out.
	readySeen map[types.NamespacedName]map[types.UID]bool
	// started is when this reconciler started: older pods' starts are not its to measure.
	started time.Time
	// startFailures backs off pools whose pods fail before they run code.
	startFailures startFailures
	// refills delays the refill of a pool that still has an idle pod (refill.go).
	refills refills
	// statusWrites spaces the writes of a pool's counts (statuswrites.go).
	statusWrites statusWrites
}

// Deps is what the pool reconciler is built with, besides its manager.
type Deps struct {
	// Keys are the manager's agent signing keys: new pods trust the current one.
	Keys *agentauth.Keyring
	// ManagerNamespace is where the pods that may call agents run (labelled
	// sandboxpod.LabelAgentClient): the only ingress the pools' NetworkPolicies allow.
	ManagerNamespace string
	// KeyEvents wakes pools when the agent signing key changes
	// (AgentKeysReconciler; nil: a channel of its own).
	KeyEvents chan event.GenericEvent
	// Dispatcher knows each pool's waiting Executions: its demand for pods.
	Dispatcher *dispatch.Dispatcher
	// Tenancy says which pools may be shared (the Shared condition).
	Tenancy *tenancy.Gate
	// Agents says which agent each Ready pod runs: pods whose protocol the
	// manager does not speak are replaced, and the status counts builds.
	Agents *agentcheck.Checker
	// Clock dates the autoscaler's claims and decisions: its rate windows,
	// scale-down delay and steps (the wall clock when nil).
	Clock clock.PassiveClock
	// SnapshotStore names the store suspended Sessions go to ("" when the
	// manager has none), for the pools' SessionSuspend condition.
	SnapshotStore string
	DemandWakes   *wakeup.Source
	// Autoscalers keep the demand record of each pool for spec.autoscaling;
	// the dispatcher feeds them every claim (Runtime wires both).
	Autoscalers *Autoscalers
	// Nodes says which nodes the pool's unclaimed pods must leave.
	Nodes *nodes.Tracker
}

// NewReconciler returns the pool reconciler: mgr's client, API reader and
// event recorder, and d.
func NewReconciler(mgr ctrl.Manager, d Deps) *Reconciler {
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	if d.KeyEvents == nil {
		d.KeyEvents = make(chan event.GenericEvent, 1024)
	}
	return &Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("sandboxpool-controller"),
		Deps: d, expectations: newExpectations(d.Clock.Now), readySeen: map[types.NamespacedName]map[types.UID]bool{},
		// Creation times are whole seconds: a pod made in the second the manager started counts.
		started: d.Clock.Now().Truncate(time.Second)}
}

// poolPods is a pool's pods sorted by what the reconciler does with them.
type poolPods struct {
	idle, warming, busy  []*corev1.Pod // current template; busy includes session pods between executions
	staleIdle, staleWarm []*corev1.Pod // built from an older spec, unclaimed
	failed, expired      []*corev1.Pod // to delete: ended pods, session pods past their idle timeout
	// displaced: unclaimed pods on a node the pool may no longer use
	// (internal/nodes), deleted and made again elsewhere; displacedWhy says why for the first.
	displaced              []*corev1.Pod
	displacedWhy           string
	nextExpiry             time.Duration // the next session idle timeout or stuck reset, for a requeue
	degradedReason, degMsg string
	unschedulable          string // the scheduler's words for the first pod it could not place
	limit                  scalingLimit
}

// requeueWithin keeps the soonest requeue.
func (p *poolPods) requeueWithin(d time.Duration) {
	if p.nextExpiry == 0 || d < p.nextExpiry {
		p.nextExpiry = d
	}
}

func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.expectations.Forget(req.NamespacedName)
			metrics.ForgetPool(req.Namespace, req.Name)
			r.mu.Lock()
			delete(r.readySeen, req.NamespacedName)
			r.startFailures.forget(req.NamespacedName)
			r.refills.forget(req.NamespacedName)
			r.mu.Unlock()
			r.Autoscalers.forget(req.NamespacedName)
			r.statusWrites.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pool.DeletionTimestamp != nil {
		return ctrl.Result{}, nil // owner references delete the pods and the Secret
	}
	if !r.Keys.Loaded() {
		// Without keys every pod would look unreachable: wait for AgentKeysReconciler.
		log.V(1).Info("waiting for the agent signing keys to load")
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	policyErr := r.ensureIsolation(ctx, pool)

	// The pool runs on every pod event that moves a count, and a deep copy of
	// each of its pods was most of the manager's CPU at scale (a pool of 1,050
	// at 30 claims a second, docs/scale.md). Nothing here writes to a listed
	// pod: it reads them, and deletes with preconditions; the pods' maps and
	// slices are the cache's and must stay unchanged.
	var podList corev1.PodList
	if err := r.List(ctx, &podList, client.InNamespace(pool.Namespace), client.MatchingLabels{sandboxpod.LabelPool: pool.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("list pods of pool %s: %w", pool.Name, err)
	}
	// Pods with the pool's labels that the pool does not own are someone
	// else's: not counted, never leased, never deleted.
	owned := podList.Items[:0] // by index: a Pod passed by value is a copy of 1 KB
	for i := range podList.Items {
		if lease.Owned(&podList.Items[i], pool) {
			owned = append(owned, podList.Items[i])
		}
	}
	podList.Items = owned
	seen := map[string]bool{}
	for i := range podList.Items {
		seen[podList.Items[i].Name] = podList.Items[i].DeletionTimestamp != nil
	}
	now := r.Clock.Now()
	pendingCreates, deleting := r.expectations.Observe(req.NamespacedName, seen, now)
	pods := r.classify(ctx, pool, podList.Items, deleting, now)
	r.observeStarts(req.NamespacedName, podList.Items)
	r.startFailures.observe(req.NamespacedName, sandboxpod.TemplateHash(pool), podList.Items, now, r.agentTrouble)
	backoff, failMsg := r.startFailures.wait(req.NamespacedName, now)
	if failMsg != "" {
		reason := sandboxv1alpha1.ReasonSandboxStartFailed
		if pods.degradedReason == sandboxv1alpha1.ReasonUnsupportedAgent {
			reason = pods.degradedReason
		}
		pods.degradedReason, pods.degMsg = reason, failMsg
	}
	ro := r.rolloutOf(pool, pods, failMsg)
	orphans, err := r.orphans(ctx, pods.busy)
	if err != nil {
		return ctrl.Result{}, err
	}
	var errs []error
	var autoscaled *sandboxv1alpha1.PoolAutoscalingStatus
	if pool.Spec.Autoscaling != nil {
		// Sets spec.replicas (stored before any pod is created or deleted for it).
		if autoscaled, err = r.autoscale(ctx, pool); err != nil {
			errs = append(errs, err)
		}
	} else {
		r.Autoscalers.off(req.NamespacedName)
	}
	if autoscaled != nil && (autoscaled.Reason == autoscale.ReasonMaxReplicas || autoscaled.Reason == autoscale.ReasonMaxPods) {
		pods.limit.add(autoscaled.Reason, autoscaled.Message)
	}
	demand, pending := r.Dispatcher.Demand(req.NamespacedName), int32(r.Dispatcher.Waiting(req.NamespacedName))
	if pool.Spec.MaxPods == nil {
		demand = min(demand, maxSurge)
	}

	// How many unclaimed pods the pool wants, and how many it has or will have.
	// A shared pool's reserve exists only as idle pods: it holds at least
	// that many whatever spec.replicas says.
	reserve := tenancy.ReservedIdle(pool)
	want := max(int(pool.Spec.Replicas), reserve) + demand
	have := len(pods.idle) + len(pods.warming) + pendingCreates
	// Old pods still starting are deleted below: they take no room.
	total := have + len(pods.busy) + len(pods.staleIdle)
	create := want - have
	if pool.Spec.MaxPods != nil {
		room := int(*pool.Spec.MaxPods) - total
		if create > 0 && room <= 0 && len(pods.staleIdle) > 0 && ro.mayEvictForRoom(len(pods.warming)+pendingCreates) {
			// No room left to surge: an old idle pod makes room for a current one (rollout.go).
			pods.failed = append(pods.failed, pods.staleIdle[0])
			pods.staleIdle = pods.staleIdle[1:]
			room++
		}
		if create > room {
			pods.limit.add(sandboxv1alpha1.ReasonMaxPods, fmt.Sprintf("maxPods %d reached: %d more pods wanted; raise spec.maxPods",
				*pool.Spec.MaxPods, create-max(room, 0)))
			create = room
		}
	}
	if wait := r.refills.wait(req.NamespacedName, pods.busy, len(pods.idle)-reserve, pending, create, now); wait > 0 {
		create = 0 // a claim's first run is under way: the boot of its replacement waits a moment
		pods.requeueWithin(wait)
	}
	if create > 0 && backoff > 0 {
		create = 0 // the last pods failed to start: wait before the next attempt
		pods.requeueWithin(backoff)
	}
	if create > 0 {
		create = min(create, maxCreatesPerReconcile)
		for i := 0; i < create; i++ {
			if err := r.createPod(ctx, pool); err != nil {
				if errors.Is(err, errNamespaceTerminating) {
					// The pool goes with its namespace: nothing to retry or report.
					break
				}
				if pods.limit.quota(err, create-i) {
					pods.requeueWithin(quotaRetry)
					break
				}
				// Say why in the status: a missing RuntimeClass, a policy, a quota the pod does not fit (no limits)...
				pods.degradedReason, pods.degMsg = "CreatePodFailed", err.Error()
				errs = append(errs, err)
				break
			}
		}
	}
	// Surplus unclaimed pods (scale down): unready ones first, then the newest.
	var toDelete []*corev1.Pod
	if surplus := have - want; surplus > 0 && pendingCreates == 0 {
		// The newest starting pods first: the older ones are closer to Ready.
		candidates := append(newestFirst(pods.warming), newestFirst(pods.idle)...)
		toDelete = append(toDelete, candidates[:min(surplus, len(candidates))]...)
	}
	// Stale pods go once enough current pods are ready to take their place.
	if len(pods.idle) >= want {
		toDelete = append(toDelete, pods.staleIdle...)
	}
	toDelete = append(toDelete, pods.staleWarm...)
	toDelete = append(toDelete, pods.failed...)
	toDelete = append(toDelete, pods.expired...)
	toDelete = append(toDelete, orphans...)
	toDelete = append(toDelete, pods.displaced...)
	for _, p := range toDelete {
		if err := r.deletePod(ctx, pool, p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(pods.displaced) > 0 {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, sandboxv1alpha1.ReasonPodsDisplaced, "Replace",
			"Replacing %d unclaimed pods on nodes the pool may no longer use (%s)", len(pods.displaced), pods.displacedWhy)
	}
	if len(pods.failed) > 0 {
		log.V(1).Info("replaced ended or stale pods", "count", len(pods.failed))
	}

	status := r.status(pool, pods, pending)
	status.UpdatedReplicas = ro.updated
	status.Agents = agentVersions(r.Agents, pods)
	progressing := ro.condition(pool.Generation)
	meta.SetStatusCondition(&status.Conditions, progressing)
	r.rolloutEvent(pool, progressing)
	status.Autoscaling = autoscaled
	status.WarmHitRatio, status.StartupSeconds = "", ""
	if ratio, ok := r.Autoscalers.warmHitRatio(req.NamespacedName); ok {
		status.WarmHitRatio = strconv.FormatFloat(ratio, 'f', 3, 64)
	}
	if d, ok := r.Autoscalers.startup(req.NamespacedName); ok {
		status.StartupSeconds = strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
	}
	others, err := r.reopeningPolicies(ctx, pool)
	if err != nil {
		errs = append(errs, err)
	}
	setPolicyCondition(&status, pool, others, policyErr)
	if policyErr != nil {
		errs = append(errs, policyErr)
	}
	if c := meta.FindStatusCondition(status.Conditions, sandboxv1alpha1.PoolConditionNetworkPolicyReady); c.Reason == sandboxv1alpha1.ReasonOtherPoliciesApply {
		if old := meta.FindStatusCondition(pool.Status.Conditions, c.Type); old == nil || old.Message != c.Message {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "Reconcile", "%s", c.Message)
		}
	}
	r.recordMetrics(pool, &status, pods, pending)
	if c := meta.FindStatusCondition(status.Conditions, sandboxv1alpha1.PoolConditionScalingLimited); c.Status == metav1.ConditionTrue &&
		(c.Reason == sandboxv1alpha1.ReasonResourceQuota || c.Reason == sandboxv1alpha1.ReasonMaxPods) {
		// The autoscaler's own caps have their AutoscalingCapped event.
		if old := meta.FindStatusCondition(pool.Status.Conditions, c.Type); old == nil || old.Status != c.Status || old.Reason != c.Reason {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "Scale", "%s", c.Message)
		}
	}
	if c := meta.FindStatusCondition(status.Conditions, sandboxv1alpha1.PoolConditionReady); c.Reason == sandboxv1alpha1.ReasonUnschedulable {
		if old := meta.FindStatusCondition(pool.Status.Conditions, c.Type); old == nil || old.Reason != c.Reason {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "Scale", "%s", c.Message)
		}
	}
	if meta.IsStatusConditionTrue(status.Conditions, sandboxv1alpha1.PoolConditionDegraded) &&
		!meta.IsStatusConditionTrue(pool.Status.Conditions, sandboxv1alpha1.PoolConditionDegraded) {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, pods.degradedReason, "Reconcile", "%s", pods.degMsg)
	}
	if !equality.Semantic.DeepEqual(status, pool.Status) {
		now := time.Now() // a rate of writes, not a policy of the pool's: not r.Clock
		if wait := r.statusWrites.wait(req.NamespacedName, &pool.Status, &status, now); wait > 0 {
			pods.requeueWithin(wait) // statuswrites.go
		} else {
			patch := client.MergeFrom(pool.DeepCopy())
			pool.Status = status
			if err := r.Status().Patch(ctx, pool, patch); err != nil {
				errs = append(errs, fmt.Errorf("update status of pool %s: %w", pool.Name, err))
			} else {
				r.statusWrites.written(req.NamespacedName, now)
			}
		}
	}
	if len(errs) > 0 {
		return ctrl.Result{}, errs[0]
	}
	if pool.Spec.Autoscaling != nil {
		pods.requeueWithin(autoscaleInterval) // the rate windows slide
	}
	if pods.nextExpiry > 0 {
		return ctrl.Result{RequeueAfter: pods.nextExpiry}, nil
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) classify(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, items []corev1.Pod, deleting map[string]bool, now time.Time) poolPods {
	log := logf.FromContext(ctx)
	var out poolPods
	hash := sandboxpod.TemplateHash(pool)
	currentKey, _ := r.Keys.Current()
	promised := r.Dispatcher.Promised(client.ObjectKeyFromObject(pool))
	for i := range items {
		p := &items[i]
		if p.DeletionTimestamp != nil || deleting[p.Name] {
			continue
		}
		if reason, msg := podstatus.Trouble(p); reason != "" && out.degradedReason == "" {
			out.degradedReason, out.degMsg = reason, fmt.Sprintf("pod %s: %s", p.Name, msg)
		}
		if msg := podstatus.Unschedulable(p); msg != "" && out.unschedulable == "" {
			out.unschedulable = fmt.Sprintf("pod %s cannot be scheduled: %s", p.Name, msg)
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			if !r.awaitsFinalStatus(ctx, &out, p, now) { // ended.go
				out.failed = append(out.failed, p)
			}
			continue
		}
		if s := lease.Session(p); s != "" && lease.ClaimedBy(p) == "" {
			// A live Session frees its pod itself when it ends; a pod whose
			// Session is gone (deleted, or ended by a manager that stopped before
			// freeing it), or a second pod a Session leased while the cache lagged
			// behind its first, is deleted here, after a grace that covers the
			// cache's lag behind a Session that has just claimed it.
			ses := &sandboxv1alpha1.Session{}
			key := types.NamespacedName{Namespace: lease.Tenant(p), Name: s}
			err := r.Get(ctx, key, ses)
			if err == nil && ses.Status.Phase == sandboxv1alpha1.SessionSuspended && ses.UID == lease.SessionUID(p) && lease.Suspending(p) &&
				ses.Status.SuspendTime != nil {
				// The sealed pod a committed suspend left (its release failed):
				// the Session resumes elsewhere, if at all, and nothing else may
				// use this pod. Its Session frees it for the grace; then the pool.
				if out.expiresIn(ses.Status.SuspendTime.Time, lease.OrphanSessionPodGrace, now) <= 0 {
					out.expired = append(out.expired, p)
				} else {
					out.busy = append(out.busy, p)
				}
				continue
			}
			if err == nil && ses.PoolKey() == client.ObjectKeyFromObject(pool) && !ses.Status.Phase.IsFinished() && lease.HeldBy(p, ses) &&
				(ses.Status.PodName == "" || ses.Status.PodName == p.Name) {
				out.busy = append(out.busy, p)
				continue
			}
			if err == nil && ses.UID == lease.HolderUID(p, ses) && ses.Status.Phase.IsFinished() && ses.Status.PodUID != "" && ses.Status.PodUID != p.UID {
				// A second pod the lease of an ended Session left labelled (its
				// cache lagged behind its first claim): the Session never used
				// it, and nobody will.
				out.expired = append(out.expired, p)
				continue
			}
			// A pod the data plane claimed for a one-call run is claimed while
			// the run's Session is created: it waits the grace below for it.
			_, forRun := p.Annotations[sandboxpod.AnnotationRun]
			if apierrors.IsNotFound(err) && !forRun && apierrors.IsNotFound(r.APIReader.Get(ctx, key, ses)) {
				// Deleted (kubectl delete ses, an SDK's close): the API server,
				// not only a cache that may lag behind a Session that has just
				// claimed the pod, says it is gone. Nobody can use the pod.
				out.expired = append(out.expired, p)
				continue
			}
			last, err := time.Parse(time.RFC3339Nano, p.Annotations[sandboxpod.AnnotationLastUsed])
			if err != nil {
				last = p.CreationTimestamp.Time
			}
			if out.expiresIn(last, lease.OrphanSessionPodGrace, now) <= 0 {
				out.expired = append(out.expired, p)
			} else {
				out.busy = append(out.busy, p)
			}
			continue
		}
		if since, resetting := lease.ResetSince(p); resetting {
			// Back to idle within a second or so; one that stays resetting lost its
			// reset to a manager restart and is replaced.
			if out.expiresIn(since, recycle.ResetTimeout, now) <= 0 {
				out.failed = append(out.failed, p)
			} else {
				out.warming = append(out.warming, p)
			}
			continue
		}
		if p.Labels[sandboxpod.LabelState] == sandboxpod.StateBusy || lease.ClaimedBy(p) != "" || promised[p.Name] {
			out.busy = append(out.busy, p)
			continue
		}
		ready := sandboxpod.IsReady(p)
		key := p.Labels[sandboxpod.LabelAgentKey]
		if !r.Keys.Has(key) {
			// Its key was removed from the keys Secret: the manager cannot call it.
			out.failed = append(out.failed, p)
			continue
		}
		if why := r.agentTrouble(p); why != "" {
			// Never called: replaced (a pod of the current template with a
			// backoff, start failures say; an old one as the rollout goes).
			if out.degradedReason == "" || out.degradedReason == sandboxv1alpha1.ReasonCrashLoopBackOff {
				out.degradedReason, out.degMsg = sandboxv1alpha1.ReasonUnsupportedAgent, fmt.Sprintf("pod %s: %s", p.Name, why)
			}
			out.failed = append(out.failed, p)
			continue
		}
		if why := r.Nodes.Excludes(pool, p.Spec.NodeName); why != "" {
			// Never handed out there (the dispatcher's Placeable): warm where it can serve.
			if out.displacedWhy == "" {
				out.displacedWhy = why
			}
			out.displaced = append(out.displaced, p)
			continue
		}
		// Built from an older spec, or trusting a key that is no longer current.
		stale := p.Labels[sandboxpod.LabelTemplateHash] != hash || key != currentKey
		if !stale {
			if err := lease.Admits(pool, p, r.Keys); err != nil {
				// Says it is the pool's and of its current template, and is not
				// built so: the dispatcher never leases it; replace it.
				log.Info("replacing a pod that is not built as its pool builds them", "pod", p.Name, "reason", err.Error())
				out.failed = append(out.failed, p)
				continue
			}
		}
		switch {
		case stale && ready:
			out.staleIdle = append(out.staleIdle, p)
		case stale:
			out.staleWarm = append(out.staleWarm, p)
		case ready:
			out.idle = append(out.idle, p)
		default:
			out.warming = append(out.warming, p)
		}
	}
	return out
}

// agentTrouble says why a pod's agent may not be called ("" when it may, or
// is not asked yet): it speaks a protocol this manager does not.
func (r *Reconciler) agentTrouble(p *corev1.Pod) string {
	if r.Agents == nil {
		return ""
	}
	info, ok := r.Agents.Lookup(p.UID)
	if !ok || info.Supported {
		return ""
	}
	return fmt.Sprintf("its agent (build %s) speaks protocol %d; this manager speaks %d to %d: use an image whose agent it speaks, or a manager that speaks %d",
		info.Build, info.Protocol, protocol.OldestVersion, protocol.Version, info.Protocol)
}

// rolloutEvent tells of a rollout that starts, stalls or completes.
func (r *Reconciler) rolloutEvent(pool *sandboxv1alpha1.SandboxPool, c metav1.Condition) {
	old := meta.FindStatusCondition(pool.Status.Conditions, c.Type)
	if old != nil && old.Reason == c.Reason {
		return
	}
	switch {
	case c.Reason == sandboxv1alpha1.ReasonRolloutStalled:
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "Rollout", "%s", c.Message)
	case c.Reason == sandboxv1alpha1.ReasonRollingOut:
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, c.Reason, "Rollout", "%s", c.Message)
	case old != nil: // complete after a rollout, not on a new pool's first status
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, c.Reason, "Rollout", "%s", c.Message)
	}
}

// expiresIn returns the time left until start+timeout and, while some is left,
// keeps the soonest such time for the reconcile's requeue.
func (out *poolPods) expiresIn(start time.Time, timeout time.Duration, now time.Time) time.Duration {
	left := start.Add(timeout).Sub(now)
	if left > 0 {
		out.requeueWithin(left)
	}
	return left
}

// observeStarts records the creation-to-Ready time of pods that became
// Ready for the first time. A pod that was Ready before (its readiness
// blipped) or was made before this manager started (its Ready time may be a
// later one) is not a start-up: its age would pass for one.
func (r *Reconciler) observeStarts(pool types.NamespacedName, pods []corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.readySeen[pool]
	seen := map[types.UID]bool{}
	for i := range pods {
		p := &pods[i]
		if old[p.UID] {
			seen[p.UID] = true
			continue
		}
		if !sandboxpod.IsReady(p) {
			continue
		}
		seen[p.UID] = true
		if p.CreationTimestamp.Time.Before(r.started) {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				d := c.LastTransitionTime.Sub(p.CreationTimestamp.Time)
				metrics.PodStart.Observe(d.Seconds())
				r.Autoscalers.started(pool, d)
			}
		}
	}
	r.readySeen[pool] = seen
}

// orphans returns busy pods claimed by an Execution that no longer exists
// (it was deleted while the manager was down, or its delete was missed), and
// pods claimed by an Execution that runs or ran on another pod (or ended
// without one): a claim made from a stale view whose Running status was never
// stored, so no code reached the pod. A pod claimed by a finished Execution
// that names it is left to that Execution's pod disposition (a session keeps
// its pod), which the Execution controller carries out after the final status.
func (r *Reconciler) orphans(ctx context.Context, busy []*corev1.Pod) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, p := range busy {
		uid := lease.ClaimedBy(p)
		if uid == "" {
			continue
		}
		ex := &sandboxv1alpha1.Execution{}
		// The Execution is in the namespace whose code the pod runs.
		key := types.NamespacedName{Namespace: lease.Tenant(p), Name: p.Annotations[sandboxpod.AnnotationClaimedBy]}
		err := r.Get(ctx, key, ex)
		if err == nil && ex.UID == uid {
			// Both are final once set, so a cache that lags cannot mislead this.
			if (ex.Status.PodName != "" && ex.Status.PodName != p.Name) || (ex.Status.Phase.IsFinished() && ex.Status.PodName == "") {
				out = append(out, p)
			}
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		// Not in the cache: make sure around it before deleting a busy pod.
		err = r.APIReader.Get(ctx, key, ex)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && ex.UID != uid):
			out = append(out, p)
		case err != nil:
			return nil, err
		}
	}
	return out, nil
}

func newestFirst(pods []*corev1.Pod) []*corev1.Pod {
	out := append([]*corev1.Pod{}, pods...)
	sort.Slice(out, func(i, j int) bool { return out[j].CreationTimestamp.Before(&out[i].CreationTimestamp) })
	return out
}

var errNamespaceTerminating = errors.New("namespace is terminating")

func (r *Reconciler) createPod(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) error {
	key, err := agentkeys.ForNewPods(r.Keys)
	if err != nil {
		return err
	}
	pod := sandboxpod.New(pool, key)
	if err := controllerutil.SetControllerReference(pool, pod, r.Scheme()); err != nil {
		return err
	}
	if err := r.Create(ctx, pod); err != nil {
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return errNamespaceTerminating
		}
		if refusedByQuota(err) {
			// No event per attempt: the ScalingLimited condition and its event say it.
			return &quotaError{fmt.Errorf("create pod for pool %s: %w", pool.Name, err)}
		}
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "CreatePodFailed", "Create", "create sandbox pod: %v", err)
		return fmt.Errorf("create pod for pool %s: %w", pool.Name, err)
	}
	r.expectations.Created(client.ObjectKeyFromObject(pool), pod.Name)
	return nil
}

func (r *Reconciler) deletePod(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) error {
	// Preconditions: never delete a pod that was claimed since we read it.
	err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			return nil // changed since read; the next reconcile sees it as it is now
		}
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	r.expectations.Deleted(client.ObjectKeyFromObject(pool), pod.Name)
	return nil
}

func (r *Reconciler) status(pool *sandboxv1alpha1.SandboxPool, pods poolPods, pending int32) sandboxv1alpha1.SandboxPoolStatus {
	st := *pool.Status.DeepCopy()
	idle := int32(len(pods.idle) + len(pods.staleIdle))
	unclaimed := idle + int32(len(pods.warming)+len(pods.staleWarm))
	ready := idle
	for _, p := range pods.busy {
		if sandboxpod.IsReady(p) {
			ready++
		}
	}
	st.Replicas, st.ReadyReplicas, st.IdleReplicas = unclaimed, ready, idle
	st.BusyReplicas = int32(len(pods.busy))
	st.PendingExecutions = pending
	st.Selector = sandboxpod.Selector(pool)
	st.ObservedGeneration = pool.Generation

	readyCond := metav1.Condition{Type: sandboxv1alpha1.PoolConditionReady, ObservedGeneration: pool.Generation}
	switch {
	case idle >= pool.Spec.Replicas:
		readyCond.Status, readyCond.Reason = metav1.ConditionTrue, sandboxv1alpha1.ReasonIdleReplicasReady
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready", idle, pool.Spec.Replicas)
	case pool.Spec.MaxPods != nil && int32(len(pods.busy))+unclaimed >= *pool.Spec.MaxPods:
		readyCond.Status, readyCond.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonMaxPodsReached
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready; maxPods %d reached: raise spec.maxPods or wait for busy pods to finish",
			idle, pool.Spec.Replicas, *pool.Spec.MaxPods)
	case pods.degradedReason != "":
		// The pods fail to start: the Degraded condition's reason says why,
		// and so does Ready's, which `kubectl get sbp` shows.
		readyCond.Status, readyCond.Reason = metav1.ConditionFalse, pods.degradedReason
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready; %s", idle, pool.Spec.Replicas, pods.degMsg)
	case pods.limit.reason != "":
		readyCond.Status, readyCond.Reason = metav1.ConditionFalse, pods.limit.reason
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready; %s", idle, pool.Spec.Replicas, strings.Join(pods.limit.messages, "; "))
	case pods.unschedulable != "":
		// Not a fault of the pool (Degraded), but what holds it back: the
		// cluster lacks room, as the scheduler says.
		readyCond.Status, readyCond.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonUnschedulable
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready; %s (add nodes or capacity, lower spec.resources.requests, "+
			"or fix spec.template's node selector and tolerations)", idle, pool.Spec.Replicas, pods.unschedulable)
	default:
		readyCond.Status, readyCond.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonPodsStarting
		readyCond.Message = fmt.Sprintf("%d of %d idle pods ready", idle, pool.Spec.Replicas)
	}
	meta.SetStatusCondition(&st.Conditions, readyCond)
	deg := metav1.Condition{Type: sandboxv1alpha1.PoolConditionDegraded, ObservedGeneration: pool.Generation,
		Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.ReasonPodsHealthy, Message: "sandbox pods start normally"}
	if pods.degradedReason != "" {
		deg.Status, deg.Reason, deg.Message = metav1.ConditionTrue, pods.degradedReason, pods.degMsg
	}
	meta.SetStatusCondition(&st.Conditions, deg)
	meta.SetStatusCondition(&st.Conditions, pods.limit.condition(pool.Generation))
	setSuspendCondition(&st, pool, r.SnapshotStore)
	var shares tenancy.Namespaces
	if r.Tenancy != nil {
		shares = r.Tenancy.Namespaces
	}
	setSharing(&st, pool, shares, r.Dispatcher.Tenants(client.ObjectKeyFromObject(pool)))
	return st
}

func (r *Reconciler) recordMetrics(pool *sandboxv1alpha1.SandboxPool, status *sandboxv1alpha1.SandboxPoolStatus, pods poolPods, pending int32) {
	metrics.PoolPods.WithLabelValues(pool.Namespace, pool.Name, "idle").Set(float64(len(pods.idle) + len(pods.staleIdle)))
	metrics.PoolPods.WithLabelValues(pool.Namespace, pool.Name, "warming").Set(float64(len(pods.warming) + len(pods.staleWarm)))
	metrics.PoolPods.WithLabelValues(pool.Namespace, pool.Name, "busy").Set(float64(len(pods.busy)))
	metrics.PoolPending.WithLabelValues(pool.Namespace, pool.Name).Set(float64(pending))
	sessions := 0
	for _, p := range pods.busy {
		if lease.Session(p) != "" {
			sessions++
		}
	}
	metrics.PoolSessions.WithLabelValues(pool.Namespace, pool.Name).Set(float64(sessions))
	for _, c := range status.Conditions {
		v := 0.0
		if c.Status == metav1.ConditionTrue {
			v = 1
		}
		metrics.PoolCondition.WithLabelValues(pool.Namespace, pool.Name, c.Type).Set(v)
	}
	recordTenants(pool, status)
	setTimestamp(metrics.PoolOldestWarming, pool, oldestCreated(pods.warming, pods.staleWarm))
	setTimestamp(metrics.PoolOldestPending, pool, r.Dispatcher.OldestWaiting(client.ObjectKeyFromObject(pool)))
	if ratio, ok := r.Autoscalers.warmHitRatio(client.ObjectKeyFromObject(pool)); ok {
		metrics.PoolWarmHitRatio.WithLabelValues(pool.Namespace, pool.Name).Set(ratio)
	} else {
		metrics.PoolWarmHitRatio.DeleteLabelValues(pool.Namespace, pool.Name)
	}
}

// oldestCreated is the earliest creation time of the pods that are starting
// (zero for none). A pod in the middle of a reset (reusePolicy
// FreshInterpreter) is not starting: its creation time would make a pool
// that resets all day look as if a pod had been starting all day.
func oldestCreated(lists ...[]*corev1.Pod) time.Time {
	var oldest time.Time
	for _, pods := range lists {
		for _, p := range pods {
			if _, resetting := lease.ResetSince(p); resetting {
				continue
			}
			if t := p.CreationTimestamp.Time; oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
		}
	}
	return oldest
}

// setTimestamp sets a pool's timestamp gauge, or removes it for the zero time.
func setTimestamp(g *prometheus.GaugeVec, pool *sandboxv1alpha1.SandboxPool, t time.Time) {
	if t.IsZero() {
		g.DeleteLabelValues(pool.Namespace, pool.Name)
		return
	}
	g.WithLabelValues(pool.Namespace, pool.Name).Set(float64(t.UnixNano()) / 1e9)
}

// maxRetryDelay bounds the backoff of a pool whose reconciles keep failing.
const maxRetryDelay = 10 * time.Second

// SetupWithManager registers the reconciler: pools, their pods and Secrets,
// and the Executions that name them (their demand).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Autoscalers == nil {
		return fmt.Errorf("the pool reconciler needs the runtime's Autoscalers (the dispatcher feeds them)")
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&sandboxv1alpha1.SandboxPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Pod{}, r.podEvents()).
		Owns(&networkingv1.NetworkPolicy{}).
		Watches(&networkingv1.NetworkPolicy{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfNamespace)).
		Owns(&policyv1.PodDisruptionBudget{}).
		WatchesRawSource(source.Channel(r.KeyEvents, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(r.DemandWakes).
		Watches(&sandboxv1alpha1.Execution{}, demandHandler()).
		Watches(&sandboxv1alpha1.Session{}, sessionEndHandler()).
		// A pool whose writes failed a while (an API server restarting, a
		// webhook down) tries again within maxRetryDelay, not the default
		// limiter's minutes: its pods are what every run waits for.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4,
			RateLimiter: workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxRetryDelay),
				// As the default's: all pools' retries together, 10 a second.
				&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)})}).
		Named("sandboxpool").
		Complete(r)
}

// podUpdateBatch is how long a pool waits after an update of one of its pods
// before it looks: the updates within it wake the pool once. Each claim, each
// status a kubelet writes and each reset moves a pod, and the pool reads all
// its pods on each look: at 30 claims a second on a pool of 1,050 that was
// most of the manager's CPU (docs/scale.md). Kubernetes' Job controller
// batches its pods' events the same way. Nothing waits on it: the
// dispatcher hears of every pod at once, and the replacement of a claimed
// pod waits refillDelay anyway. A pod created or deleted wakes its pool at
// once (its expectations, a pool with no pod left).
const podUpdateBatch = 100 * time.Millisecond

// podEvents wakes the pool that controls a pod, and tells its expectations
// of every pod the informer shows created or deleted.
func (r *Reconciler) podEvents() handler.EventHandler {
	poolOf := func(o client.Object) (ctrl.Request, bool) {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != "SandboxPool" || !strings.HasPrefix(ref.APIVersion, sandboxv1alpha1.GroupVersion.Group+"/") {
			return ctrl.Request{}, false
		}
		return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}, true
	}
	now := func(o client.Object, q wakeup.Queue) {
		req, ok := poolOf(o)
		if !ok {
			return
		}
		// Only pods a pool controls under its label: a tenant's own pods with
		// a pool's label must not fill the table (a pool that never
		// reconciles never prunes it).
		if req.Name == o.GetLabels()[sandboxpod.LabelPool] {
			r.expectations.Seen(req.NamespacedName, o.GetName())
		}
		q.Add(req)
	}
	return handler.Funcs{
		CreateFunc:  func(_ context.Context, e event.CreateEvent, q wakeup.Queue) { now(e.Object, q) },
		DeleteFunc:  func(_ context.Context, e event.DeleteEvent, q wakeup.Queue) { now(e.Object, q) },
		GenericFunc: func(_ context.Context, e event.GenericEvent, q wakeup.Queue) { now(e.Object, q) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q wakeup.Queue) {
			if req, ok := poolOf(e.ObjectNew); ok {
				q.AddAfter(req, podUpdateBatch)
			}
		},
	}
}

// sessionEndHandler wakes a pool when one of its Sessions ends or is deleted
// (a pod it leaves behind is the pool's to free) or becomes Ready (a second
// pod it leased, if any, is no longer its pod).
func sessionEndHandler() handler.EventHandler {
	enqueue := func(o client.Object, q wakeup.Queue) {
		if ses, ok := o.(*sandboxv1alpha1.Session); ok {
			q.AddAfter(ctrl.Request{NamespacedName: ses.PoolKey()}, lease.OrphanSessionPodGrace)
		}
	}
	return handler.Funcs{
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q wakeup.Queue) {
			old, cur := e.ObjectOld.(*sandboxv1alpha1.Session), e.ObjectNew.(*sandboxv1alpha1.Session)
			if cur.Status.Phase != old.Status.Phase && (cur.Status.Phase.IsFinished() || cur.Status.Phase == sandboxv1alpha1.SessionReady ||
				cur.Status.Phase == sandboxv1alpha1.SessionSuspended) {
				enqueue(cur, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q wakeup.Queue) {
			// At once as well: a deleted Session's pod is freed as soon as
			// the API server confirms the Session is gone (classify).
			if ses, ok := e.Object.(*sandboxv1alpha1.Session); ok {
				q.Add(ctrl.Request{NamespacedName: ses.PoolKey()})
			}
			enqueue(e.Object, q)
		},
	}
}

// poolsOfNamespace enqueues every pool of a NetworkPolicy's namespace: any
// policy there may select a pool's pods (the pool's own policy also reaches
// its owner through Owns).
func (r *Reconciler) poolsOfNamespace(ctx context.Context, o client.Object) []ctrl.Request {
	var pools sandboxv1alpha1.SandboxPoolList
	if err := r.List(ctx, &pools, client.InNamespace(o.GetNamespace())); err != nil {
		logf.FromContext(ctx).Error(err, "list pools for a NetworkPolicy change", "networkPolicy", client.ObjectKeyFromObject(o))
		return nil
	}
	reqs := make([]ctrl.Request, 0, len(pools.Items))
	for _, p := range pools.Items {
		if !metav1.IsControlledBy(o, &p) {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
	}
	return reqs
}

// DemandDebounce batches the pool reconciles that Execution changes cause: a
// burst of Executions becomes one reconcile (and one status write) instead of
// one per transition.
const DemandDebounce = 250 * time.Millisecond

// demandHandler enqueues an Execution's pool, a little later, when the
// Execution goes: a pod it still held is an orphan. (Demand changes come from
// the dispatcher.)
func demandHandler() handler.EventHandler {
	return handler.Funcs{
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[ctrl.Request]) {
			ex, ok := e.Object.(*sandboxv1alpha1.Execution)
			if !ok {
				return
			}
			q.AddAfter(ctrl.Request{NamespacedName: ex.PoolKey()}, DemandDebounce)
		},
	}
}
