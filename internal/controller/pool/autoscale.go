package pool

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/autoscale"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/metrics"
)

// The long window of the claim rate by default (Knative's stable window;
// the short one, its panic window, is a tenth of it), and how often an
// autoscaled pool is looked at again as they slide.
const (
	defaultStableWindow = 60 * time.Second
	autoscaleInterval   = 5 * time.Second
	// startupFallback is the start-up time planned for before any pod of
	// the pool became Ready (a gVisor pod here: about 2 s alone).
	startupFallback = 5 * time.Second
)

// Autoscalers keeps, per pool, the record the autoscaler decides from: the
// claims (fed by the dispatcher for every pool, so that turning autoscaling
// on starts with history), the pods' start-up times and the policy's past
// recommendations. In memory: a restarted manager starts a new record, and
// holds the pool's current replicas for the scale-down delay.
type Autoscalers struct {
	mu                  sync.Mutex
	pools               map[types.NamespacedName]*poolRecord
	now                 func() time.Time
	stable, burstWindow time.Duration
}

type poolRecord struct {
	arrivals *autoscale.Arrivals
	// served and warm count the claims served, and those served warm, over
	// the same window: the warm-hit ratio the status shows.
	served, warm *autoscale.Arrivals
	startup      autoscale.Startup
	policy       autoscale.Policy
	seeded       bool
}

func (r *poolRecord) warmHitRatio(now time.Time, window time.Duration) (float64, bool) {
	served := r.served.Count(now, window)
	if served == 0 {
		return 0, false
	}
	return float64(r.warm.Count(now, window)) / float64(served), true
}

// NewAutoscalers returns an empty record dated by now, whose claim rate has a
// long window of window (0: 60 s) and a short one of a tenth of it.
func NewAutoscalers(now func() time.Time, window time.Duration) *Autoscalers {
	if window <= 0 {
		window = defaultStableWindow
	}
	return &Autoscalers{pools: map[types.NamespacedName]*poolRecord{}, now: now, stable: window, burstWindow: window / 10}
}

func (a *Autoscalers) record(pool types.NamespacedName) *poolRecord {
	r := a.pools[pool]
	if r == nil {
		r = &poolRecord{arrivals: autoscale.NewArrivals(a.stable), served: autoscale.NewArrivals(a.stable),
			warm: autoscale.NewArrivals(a.stable)}
		a.pools[pool] = r
	}
	return r
}

// Claim records a claim of a pool's pod made at created.
func (a *Autoscalers) Claim(pool types.NamespacedName, created time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.record(pool).arrivals.AddAt(a.now(), created)
}

// Claimed records how a claim of a pool's pod was served.
func (a *Autoscalers) Claimed(pool types.NamespacedName, c dispatch.Claimed) {
	warm := c.Warm
	outcome := "cold"
	if warm {
		outcome = "warm"
	}
	metrics.PoolClaims.WithLabelValues(pool.Namespace, pool.Name, outcome).Inc()
	if c.Chosen {
		metrics.PoolTenantQueueWait.WithLabelValues(pool.Namespace, pool.Name, c.Namespace).Observe(c.Queued.Seconds())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.record(pool)
	now := a.now()
	r.served.Add(now, 1)
	if warm {
		r.warm.Add(now, 1)
	}
}

// warmHitRatio is the share of the pool's claims of the long window served
// warm, for every pool (autoscaled or not); false without claims.
func (a *Autoscalers) warmHitRatio(pool types.NamespacedName) (float64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.pools[pool]
	if !ok {
		return 0, false
	}
	return r.warmHitRatio(a.now(), a.stable)
}

// startup is the pool's start-up estimate; false before any of its pods became Ready.
func (a *Autoscalers) startup(pool types.NamespacedName) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.pools[pool]
	if !ok || r.startup.Observed() == 0 {
		return 0, false
	}
	return r.startup.Estimate(0), true
}

// started records the creation-to-Ready time of one of the pool's pods.
func (a *Autoscalers) started(pool types.NamespacedName, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.record(pool).startup.Observe(d)
}

func (a *Autoscalers) forget(pool types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pools, pool)
}

// off forgets the decisions of a pool whose autoscaling is off (the claims
// and start-ups stay): turned on again, it starts from the replicas it then
// has, held for the delay.
func (a *Autoscalers) off(pool types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.pools[pool]; r != nil && r.seeded {
		r.policy, r.seeded = autoscale.Policy{}, false
		metrics.PoolDesiredReplicas.DeleteLabelValues(pool.Namespace, pool.Name)
	}
}

// decide returns the idle pods an autoscaled pool should keep, and the
// status that explains it.
func (a *Autoscalers) decide(pool *sandboxv1alpha1.SandboxPool) (autoscale.Decision, *sandboxv1alpha1.PoolAutoscalingStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}
	r := a.record(key)
	as := pool.Spec.Autoscaling
	spec := autoscale.Spec{MinReplicas: as.MinReplicas, MaxReplicas: as.MaxReplicas, Target: 0.99,
		StableWindow: a.stable, PanicWindow: a.burstWindow, StepInterval: autoscaleInterval}
	maxPodsBinds := pool.Spec.MaxPods != nil && *pool.Spec.MaxPods < as.MaxReplicas
	if maxPodsBinds { // spec.replicas may not exceed maxPods (the CRD says so)
		spec.MaxReplicas = *pool.Spec.MaxPods
	}
	spec.MinReplicas = min(spec.MinReplicas, spec.MaxReplicas)
	if t, err := strconv.ParseFloat(as.TargetWarmRatio, 64); err == nil && t > 0 && t < 1 {
		spec.Target = t
	}
	if as.ScaleDownDelay != nil {
		spec.ScaleDownDelay = as.ScaleDownDelay.Duration
	}
	if !r.seeded {
		// What the pool has now holds for the scale-down delay: a restart
		// (an empty record) must not look like a quiet pool.
		r.policy.Seed(now, pool.Spec.Replicas)
		r.seeded = true
	}
	demand := autoscale.Demand{Now: now, StableRate: r.arrivals.Rate(now, a.stable),
		PanicRate: r.arrivals.Rate(now, a.burstWindow), Startup: r.startup.Estimate(startupFallback),
		Current: pool.Spec.Replicas}
	d := r.policy.Decide(spec, demand)
	if maxPodsBinds && d.Reason == autoscale.ReasonMaxReplicas {
		d.Reason = autoscale.ReasonMaxPods
		d.Message = strings.Replace(d.Message, "capped at maxReplicas", "capped at maxPods", 1)
	}
	st := &sandboxv1alpha1.PoolAutoscalingStatus{
		DesiredReplicas: d.Replicas,
		ClaimRate:       strconv.FormatFloat(demand.StableRate, 'f', 3, 64),
		BurstClaimRate:  strconv.FormatFloat(demand.PanicRate, 'f', 3, 64),
		StartupSeconds:  strconv.FormatFloat(demand.Startup.Seconds(), 'f', 1, 64),
		Reason:          d.Reason,
		Message:         d.Message,
	}
	if ratio, ok := r.warmHitRatio(now, a.stable); ok {
		st.WarmHitRatio = strconv.FormatFloat(ratio, 'f', 3, 64)
	}
	metrics.PoolDesiredReplicas.WithLabelValues(pool.Namespace, pool.Name).Set(float64(d.Replicas))
	if d.Replicas == 0 {
		st.Message += "; no idle pod: the next claim waits for a pod to start"
	}
	if r.startup.Observed() == 0 {
		st.Message += fmt.Sprintf(" (no pod of the pool became Ready yet: start-up assumed %s)", startupFallback)
	}
	return d, st
}

// autoscale applies spec.autoscaling to pool: it stores the decision in
// spec.replicas first (the commit point: pods are created or deleted for the
// stored value only) and returns the status block and an event to tell.
func (r *Reconciler) autoscale(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) (*sandboxv1alpha1.PoolAutoscalingStatus, error) {
	d, st := r.Autoscalers.decide(pool)
	prev := pool.Status.Autoscaling
	st.LastScaleTime = nil
	if prev != nil {
		st.LastScaleTime = prev.LastScaleTime
	}
	if stored := pool.Spec.Replicas; stored != d.Replicas {
		// Optimistic: a person who just turned autoscaling off and set
		// replicas is not overwritten from a stale cache.
		patch := client.MergeFromWithOptions(pool.DeepCopy(), client.MergeFromWithOptimisticLock{})
		pool.Spec.Replicas = d.Replicas
		if err := r.Patch(ctx, pool, patch); err != nil {
			pool.Spec.Replicas = stored // pods follow what is stored, nothing else
			return prev, fmt.Errorf("scale pool %s to %d replicas: %w", pool.Name, d.Replicas, err)
		}
		now := metav1.NewTime(r.Autoscalers.now())
		st.LastScaleTime = &now
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "Autoscaled", "Scale", "%d idle pods: %s", d.Replicas, d.Message)
	}
	if d.Capped() && (prev == nil || prev.Reason != d.Reason) {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "AutoscalingCapped", "Scale",
			"demand asks for %d idle pods, the pool allows %d (%s): claims may wait for pods to start", d.Wanted, d.Replicas, d.Reason)
	}
	return st, nil
}
