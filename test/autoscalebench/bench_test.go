package main

import (
	"math"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

func TestGenerateIsSeededAndFollowsThePhases(t *testing.T) {
	phases := []phase{{"steady", 2, 500}, {"quiet", 0, 100}, {"burst", 10, 100}}
	a, b := generate(phases, 7), generate(phases, 7)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed drew different arrivals")
	}
	if reflect.DeepEqual(a, generate(phases, 8)) {
		t.Fatal("another seed drew the same arrivals")
	}
	counts := make([]int, len(phases))
	for i, x := range a {
		if i > 0 && x.At < a[i-1].At {
			t.Fatalf("arrival %d at %s before the one before it", i, x.At)
		}
		counts[x.Phase]++
		if x.Phase == 1 {
			t.Fatalf("an arrival at %s in the quiet phase", x.At)
		}
	}
	// Poisson counts: mean λt, standard deviation sqrt(λt); 4 deviations.
	for i, p := range phases {
		want := p.Rate * p.Seconds
		if math.Abs(float64(counts[i])-want) > 4*math.Sqrt(want)+1e-9 {
			t.Errorf("phase %s: %d arrivals, want about %.0f", p.Name, counts[i], want)
		}
	}
	if got := meanRate(phases); math.Abs(got-(1000.0+1000)/700) > 1e-9 {
		t.Errorf("mean rate %g", got)
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time              { return c.t }
func (c *clock) step(d time.Duration) *clock { c.t = c.t.Add(d); return c }

func pod(uid string, ready bool, claimedBy string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: uid,
		Labels: map[string]string{sandboxpod.LabelPool: "p"}, Annotations: map[string]string{}}}
	if ready {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	if claimedBy != "" {
		p.Annotations[sandboxpod.AnnotationClaimedBy] = claimedBy
	}
	return p
}

func TestRecorderCountsIdleSecondsWarmClaimsAndWaits(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	r := newRecorder(c.now)
	r.onPod(pod("a", false, ""), false)
	c.step(2 * time.Second)
	r.onPod(pod("a", true, ""), false) // idle from 1002, before the span
	r.created("before", "p", -1)       // a warm-up claim: not measured
	r.begin([]string{"p"}, c.t.Add(time.Second), c.t.Add(11*time.Second))
	c.step(3 * time.Second)
	r.created("warm", "p", 0) // at 1005: pod a is Ready
	c.step(100 * time.Millisecond)
	r.onPod(pod("a", true, "warm"), false) // a idle 1003..1005.1 within the span: 2.1 s
	r.created("cold", "p", 1)              // at 1005.1: no idle pod
	r.onPod(pod("b", false, ""), false)
	c.step(2 * time.Second)
	r.onPod(pod("b", true, ""), false) // b idle from 1007.1
	c.step(500 * time.Millisecond)
	r.onPod(pod("b", true, "cold"), false) // 0.5 s idle; cold claim waited 2.5 s
	r.onPod(pod("a", true, "warm"), true)
	r.onExecution(&sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Name: "warm"},
		Status: sandboxv1alpha1.ExecutionStatus{Phase: sandboxv1alpha1.PhaseSucceeded, CompletionTime: &metav1.Time{}}})
	r.onPod(pod("c", true, ""), false) // idle from 1007.6 to the span's end, 1013: 5.4 s
	c.step(10 * time.Second)
	r.finish([]string{"p"})

	res := r.result("p", 2)
	if res.Claims != 2 || res.Warm != 1 || res.PhaseWarm[0] != 1 || res.PhaseWarm[1] != 0 {
		t.Errorf("claims %d, warm %d (by phase %v), want 2 and 1 (the first)", res.Claims, res.Warm, res.PhaseWarm)
	}
	if res.Failed != 1 {
		t.Errorf("failed %d, want 1 (the cold claim never ended)", res.Failed)
	}
	if res.WaitMax != 2500*time.Millisecond || res.WaitP50 != 100*time.Millisecond {
		t.Errorf("waits p50 %s, max %s; want 100ms and 2.5s", res.WaitP50, res.WaitMax)
	}
	if want := 2.1 + 0.5 + 5.4; math.Abs(res.IdlePodSeconds-want) > 1e-6 {
		t.Errorf("idle pod-seconds %.3f, want %.1f", res.IdlePodSeconds, want)
	}
	if res.PodsMade != 2 {
		t.Errorf("pods made %d in the span, want 2 (b and c)", res.PodsMade)
	}
	if got := r.startups("p"); len(got) != 3 || got[0] != 2*time.Second || got[1] != 2*time.Second || got[2] != 0 {
		t.Errorf("start-ups %v", got)
	}
}

func TestTenantArrivalsAreSeededWithOneBurstEach(t *testing.T) {
	const n, total = 20, 120 * time.Second
	a, b := tenantArrivals(n, 3, total, true), tenantArrivals(n, 3, total, true)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed drew different arrivals")
	}
	bursts := map[int]int{}
	for i, x := range a {
		if i > 0 && x.at < a[i-1].at {
			t.Fatalf("arrival %d out of order", i)
		}
		if x.at >= total {
			t.Fatalf("an arrival at %s, past the trace's %s", x.at, total)
		}
		if x.phase == 1 {
			bursts[x.tenant]++
		}
	}
	// 0.8/s for 10 s: 8 expected per tenant; 20 tenants, 160 ± 4·sqrt(160).
	sum := 0
	for _, c := range bursts {
		sum += c
	}
	if len(bursts) < n-1 || math.Abs(float64(sum)-160) > 4*math.Sqrt(160) {
		t.Errorf("%d tenants burst, %d burst arrivals: want about 160 over (almost) every tenant", len(bursts), sum)
	}
	for _, x := range tenantArrivals(n, 3, 20*time.Second, false) {
		if x.phase != 0 {
			t.Fatalf("a warm-up arrival in phase %d: the warm-up is steady", x.phase)
		}
	}
}
