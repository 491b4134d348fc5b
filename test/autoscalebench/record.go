package main

import (
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// recorder keeps what the benchmark saw, every time taken on this side from
// watch events: when each pod became Ready and was claimed, when each claim
// was made and served, and the idle pods of each pool over time.
type recorder struct {
	mu     sync.Mutex
	now    func() time.Time
	pods   map[types.UID]*podState
	claims map[string]*claim // by Execution name
	pools  map[string]*poolState
	// groupOf names the pool a pod is counted in, from its pool label (nil:
	// the label itself): -tenants counts twenty pools' pods as one.
	groupOf func(pool string) string
}

type podState struct {
	pool    string
	seen    time.Time // first seen (its creation, give or take a watch event)
	ready   time.Time // first seen Ready; zero before
	claimed bool
	idle    bool
}

type claim struct {
	pool    string
	phase   int       // of the trace; < 0 in the warm-up, not measured
	created time.Time // just before the create call
	served  time.Time // its pod's claim seen; zero before
	warm    bool      // that pod was Ready before the claim was made
	ended   bool
	outcome sandboxv1alpha1.ExecutionPhase
}

type poolState struct {
	start, end  time.Time // the measured span; zero before the trace starts
	idle        int
	last        time.Time
	idleSeconds float64
	podsMade    int // pods first seen within the measured span
	startups    []time.Duration
	spanStarts  []time.Duration // of the pods made within the span
}

func newRecorder(now func() time.Time) *recorder {
	return &recorder{now: now, pods: map[types.UID]*podState{}, claims: map[string]*claim{}, pools: map[string]*poolState{}}
}

func (r *recorder) pool(name string) *poolState {
	p, ok := r.pools[name]
	if !ok {
		p = &poolState{last: r.now()}
		r.pools[name] = p
	}
	return p
}

// advance adds the pool's idle pods since its last change, within the span.
func (r *recorder) advance(p *poolState, now time.Time) {
	if !p.start.IsZero() {
		from, to := p.last, now
		if from.Before(p.start) {
			from = p.start
		}
		if to.After(p.end) {
			to = p.end
		}
		if to.After(from) {
			p.idleSeconds += float64(p.idle) * to.Sub(from).Seconds()
		}
	}
	p.last = now
}

// begin starts the pools' measured span.
func (r *recorder) begin(pools []string, start, end time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range pools {
		p := r.pool(name)
		r.advance(p, start)
		p.start, p.end = start, end
	}
}

// finish closes the pools' idle integrals at their span's end.
func (r *recorder) finish(pools []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range pools {
		p := r.pool(name)
		r.advance(p, p.end)
	}
}

func (p *poolState) inSpan(t time.Time) bool {
	return !p.start.IsZero() && !t.Before(p.start) && t.Before(p.end)
}

// created records a claim about to be made.
func (r *recorder) created(name, pool string, phase int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claims[name] = &claim{pool: pool, phase: phase, created: r.now()}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// onPod takes a pod's new state (gone: deleted).
func (r *recorder) onPod(pod *corev1.Pod, gone bool) {
	pool := pod.Labels[sandboxpod.LabelPool]
	if pool == "" {
		return
	}
	if r.groupOf != nil {
		pool = r.groupOf(pool)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	ps := r.pool(pool)
	st, ok := r.pods[pod.UID]
	if !ok {
		if gone {
			return
		}
		st = &podState{pool: pool, seen: now}
		r.pods[pod.UID] = st
		if ps.inSpan(now) {
			ps.podsMade++
		}
	}
	ready := !gone && pod.DeletionTimestamp == nil && podReady(pod)
	if ready && st.ready.IsZero() {
		st.ready = now
		ps.startups = append(ps.startups, now.Sub(st.seen))
		if ps.inSpan(st.seen) {
			ps.spanStarts = append(ps.spanStarts, now.Sub(st.seen))
		}
	}
	if by := pod.Annotations[sandboxpod.AnnotationClaimedBy]; by != "" && !st.claimed {
		st.claimed = true
		if c := r.claims[by]; c != nil && c.served.IsZero() {
			c.served = now
			c.warm = !st.ready.IsZero() && st.ready.Before(c.created)
		}
	}
	if pod.Labels[sandboxpod.LabelSession] != "" {
		st.claimed = true
	}
	idle := ready && !st.claimed
	if idle != st.idle {
		r.advance(ps, now)
		if idle {
			ps.idle++
		} else {
			ps.idle--
		}
		st.idle = idle
	}
	if gone {
		delete(r.pods, pod.UID)
	}
}

// onExecution takes an Execution's new state.
func (r *recorder) onExecution(ex *sandboxv1alpha1.Execution) {
	if ex.Status.CompletionTime == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.claims[ex.Name]; c != nil && !c.ended {
		c.ended, c.outcome = true, ex.Status.Phase
	}
}

// idleNow is the pool's idle pods at this moment.
func (r *recorder) idleNow(pool string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool(pool).idle
}

// startups are the pool's pods' times from first seen to Ready.
func (r *recorder) startups(pool string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.pool(pool).startups...)
}

// podsOf counts the pool's pods that exist.
func (r *recorder) podsOf(pool string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, st := range r.pods {
		if st.pool == pool {
			n++
		}
	}
	return n
}

// since counts the claims of pool made at or after t (what a rate() of the
// claims counter sees).
func (r *recorder) since(pool string, t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.claims {
		if c.pool == pool && !c.created.Before(t) {
			n++
		}
	}
	return n
}

// pending counts the claims of pools that have not ended.
func (r *recorder) pending(pools []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.claims {
		if !c.ended && slices.Contains(pools, c.pool) {
			n++
		}
	}
	return n
}

// result is one strategy's numbers over the measured span.
type result struct {
	Claims, Warm, Unserved, Failed int
	WaitP50, WaitP99, WaitMax      time.Duration
	IdlePodSeconds                 float64
	PodsMade                       int
	// StartP50 and StartP90: creation to Ready of the pods made in the span.
	StartP50, StartP90 time.Duration
	// PhaseClaims and PhaseWarm by the trace's phases.
	PhaseClaims, PhaseWarm []int
}

func (r *result) HitRatio() float64 {
	if r.Claims == 0 {
		return 0
	}
	return float64(r.Warm) / float64(r.Claims)
}

func (r *recorder) result(pool string, phases int) result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := result{PhaseClaims: make([]int, phases), PhaseWarm: make([]int, phases)}
	var waits []time.Duration
	for _, c := range r.claims {
		if c.pool != pool || c.phase < 0 {
			continue
		}
		res.Claims++
		res.PhaseClaims[c.phase]++
		if c.served.IsZero() {
			res.Unserved++
		} else {
			waits = append(waits, c.served.Sub(c.created))
		}
		if c.warm {
			res.Warm++
			res.PhaseWarm[c.phase]++
		}
		if c.outcome != sandboxv1alpha1.PhaseSucceeded {
			res.Failed++
		}
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	res.WaitP50, res.WaitP99 = quantile(waits, 0.5), quantile(waits, 0.99)
	if len(waits) > 0 {
		res.WaitMax = waits[len(waits)-1]
	}
	if p := r.pools[pool]; p != nil {
		res.IdlePodSeconds, res.PodsMade = p.idleSeconds, p.podsMade
		starts := append([]time.Duration(nil), p.spanStarts...)
		sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
		res.StartP50, res.StartP90 = quantile(starts, 0.5), quantile(starts, 0.9)
	}
	return res
}

// quantile of sorted values, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// coldAt lists when (seconds after start) the claims of pool that found no
// warm pod were made.
func (r *recorder) coldAt(pool string, start time.Time) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []float64
	for _, c := range r.claims {
		if c.pool == pool && c.phase >= 0 && !c.warm {
			out = append(out, c.created.Sub(start).Seconds())
		}
	}
	sort.Float64s(out)
	return out
}

// slowestAt is when (seconds after start) the claim of pool that waited
// longest for its pod was made.
func (r *recorder) slowestAt(pool string, start time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at float64
	var longest time.Duration
	for _, c := range r.claims {
		if c.pool == pool && c.phase >= 0 && !c.served.IsZero() && c.served.Sub(c.created) > longest {
			longest, at = c.served.Sub(c.created), c.created.Sub(start).Seconds()
		}
	}
	return at
}
