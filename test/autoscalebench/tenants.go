package main

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// -tenants N: what one shared pool saves against a pool per namespace. N
// tenant namespaces each replay a bursty trace of their own (steady, one
// burst at a seeded moment, steady), first against N autoscaled pools, one
// in each namespace, then against one autoscaled shared pool that admits
// them all: the same arrivals, one after the other, each with its warm-up.
//
// -fairness: a small tenant's waits on a shared pool alone, then while a
// big tenant's burst of -burst Executions waits: without a limit on the big
// tenant's pods, with one, and with one and reserved idle pods.

const tenantLabel = "autoscalebench.warmpool.dev/tenant"

// tenantArrival is one claim of one tenant.
type tenantArrival struct {
	tenant int
	at     time.Duration
	phase  int
}

// tenantPhases is tenant i's trace: a burst at a moment drawn from seed.
func tenantPhases(total, burst time.Duration, steady, burstRate float64, rng *rand.Rand) []phase {
	at := time.Duration(rng.Int63n(int64(total - burst - 10*time.Second)))
	return []phase{{"steady", steady, at.Seconds()}, {"burst", burstRate, burst.Seconds()},
		{"steady", steady, (total - at - burst).Seconds()}}
}

// tenantArrivals draws the n tenants' traces; without burst, the steady rate
// alone (the warm-up).
func tenantArrivals(n int, seed int64, total time.Duration, burst bool) []tenantArrival {
	rng := rand.New(rand.NewSource(seed))
	var out []tenantArrival
	for i := range n {
		phases := []phase{{"steady", 0.02, total.Seconds()}}
		if burst {
			phases = tenantPhases(total, 10*time.Second, 0.02, 0.8, rng)
		}
		for _, a := range generate(phases, seed+int64(i)+1) {
			out = append(out, tenantArrival{tenant: i, at: a.At, phase: a.Phase})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// tenantSetup is the namespaces of a -tenants or -fairness run, watched into rec.
type tenantSetup struct {
	c       client.Client
	rec     *recorder
	shared  string
	tenants []string
}

func newTenantSetup(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, rec *recorder, n int) (*tenantSetup, func(), error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, func() {}, err
	}
	t := &tenantSetup{c: c, rec: rec, shared: tenancy.DefaultSharedNamespaces[0]}
	var made []string
	wctx, stop := context.WithCancel(ctx)
	cleanup := func() {
		stop()
		for _, ns := range made {
			_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.shared}}); err != nil {
		return nil, cleanup, fmt.Errorf("create namespace %s (it must not exist yet): %w", t.shared, err)
	}
	made = append(made, t.shared)
	for i := range n {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: fmt.Sprintf("tenant%02d-", i),
			Labels: map[string]string{tenantLabel: "yes"}}}
		if err := c.Create(ctx, ns); err != nil {
			return nil, cleanup, err
		}
		made = append(made, ns.Name)
		t.tenants = append(t.tenants, ns.Name)
	}
	if err := watch(wctx, cfg, scheme, rec, made...); err != nil {
		return nil, cleanup, err
	}
	return t, cleanup, nil
}

func benchPool(ns, name string, o options) *wrappers.PoolWrapper {
	return wrappers.Pool(ns, name).Image(o.image).RuntimeClass(o.runtimeClass)
}

// create makes the pools, counted in group, and waits for their idle pods.
func (t *tenantSetup) create(ctx context.Context, group string, pools ...*sandboxv1alpha1.SandboxPool) error {
	idle := 0
	for _, p := range pools {
		if err := t.c.Create(ctx, p); err != nil {
			return fmt.Errorf("create pool %s/%s: %w", p.Namespace, p.Name, err)
		}
		n := p.Spec.Replicas
		if p.Spec.Sharing != nil {
			n = max(n, p.Spec.Sharing.ReservedIdlePods) // the pool keeps its reserve idle too
		}
		idle += int(n)
	}
	return waitIdle(ctx, t.rec, group, idle, 3*time.Minute)
}

// drain scales the pools to zero, waits until their pods are gone, and deletes them.
func (t *tenantSetup) drain(ctx context.Context, group string, pools ...*sandboxv1alpha1.SandboxPool) error {
	for _, p := range pools {
		// The autoscaler writes replicas too: read again on a conflict.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &sandboxv1alpha1.SandboxPool{}
			if err := t.c.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
				return err
			}
			cur.Spec.Autoscaling, cur.Spec.Replicas = nil, 0
			if cur.Spec.Sharing != nil {
				cur.Spec.Sharing.ReservedIdlePods = 0 // a reserve is kept idle whatever the replicas
			}
			return t.c.Update(ctx, cur)
		}); err != nil {
			return fmt.Errorf("scale pool %s to zero: %w", p.Name, err)
		}
	}
	if err := waitIdle(ctx, t.rec, group, -1, 5*time.Minute); err != nil {
		return err
	}
	for _, p := range pools {
		if err := t.c.Delete(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// claim creates an Execution of pool for tenant ns, recorded in group.
func (t *tenantSetup) claim(ctx context.Context, wg *sync.WaitGroup, errs chan<- error, ns, name, group string, ref sandboxv1alpha1.PoolReference, code string, phase int) {
	t.rec.created(name, group, phase)
	wg.Add(1)
	go func() {
		defer wg.Done()
		ex := wrappers.Execution(ns, name).SharedPool(ref.Namespace, ref.Name).Code(code).Obj()
		if err := t.c.Create(ctx, ex); err != nil {
			select {
			case errs <- fmt.Errorf("create Execution %s/%s: %w", ns, name, err):
			default:
			}
		}
	}()
}

// waitEnded waits until every claim of groups ended.
func (t *tenantSetup) waitEnded(groups ...string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for t.rec.pending(groups) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d claims of %v did not end within 5 minutes", t.rec.pending(groups), groups)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

func runTenants(cfg *rest.Config, scheme *runtime.Scheme, label string, o options, n int) error {
	ctx := context.Background()
	rec := newRecorder(time.Now)
	rec.groupOf = func(pool string) string {
		if strings.HasPrefix(pool, "own-") {
			return "per-namespace"
		}
		return pool
	}
	t, cleanup, err := newTenantSetup(ctx, cfg, scheme, rec, n)
	defer cleanup()
	if err != nil {
		return err
	}
	total := 120 * time.Second
	arrivals := tenantArrivals(n, o.seed, total, true)
	fmt.Printf("\n== %s: %d tenants, each steady 0.02/s with one 10 s burst at 0.8/s at a seeded moment, %s; %d claims, seed %d; scale-down delay %s\n",
		label, n, total, len(arrivals), o.seed, o.scaleDownDelay)

	own := make([]*sandboxv1alpha1.SandboxPool, n)
	for i, ns := range t.tenants {
		own[i] = benchPool(ns, fmt.Sprintf("own-%02d", i), o).Replicas(1).Autoscaling(1, 10, o.scaleDownDelay).Obj()
	}
	shared := benchPool(t.shared, "shared", o).Replicas(1).Autoscaling(1, int32(2*n), o.scaleDownDelay).
		Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{}).Obj()

	type run struct {
		group string
		pools []*sandboxv1alpha1.SandboxPool
		ref   func(i int) sandboxv1alpha1.PoolReference
	}
	runs := []run{
		{"per-namespace", own, func(i int) sandboxv1alpha1.PoolReference { return sandboxv1alpha1.PoolReference{Name: own[i].Name} }},
		{"shared", []*sandboxv1alpha1.SandboxPool{shared}, func(int) sandboxv1alpha1.PoolReference {
			return sandboxv1alpha1.PoolReference{Namespace: t.shared, Name: shared.Name}
		}},
	}
	results := map[string]result{}
	for _, r := range runs {
		if err := t.create(ctx, r.group, r.pools...); err != nil {
			return err
		}
		errs := make(chan error, 1)
		var wg sync.WaitGroup
		replay := func(list []tenantArrival, start time.Time, prefix string) {
			for k, a := range list {
				time.Sleep(time.Until(start.Add(a.at)))
				t.claim(ctx, &wg, errs, t.tenants[a.tenant], fmt.Sprintf("%s-%s%04d", r.group, prefix, k), r.group, r.ref(a.tenant), "pass", a.phase)
			}
		}
		if o.warmup > 0 {
			warm := tenantArrivals(n, o.seed+1000, o.warmup, false)
			for i := range warm {
				warm[i].phase = -1
			}
			replay(warm, time.Now(), "w")
		}
		start := time.Now()
		end := start.Add(total)
		rec.begin([]string{r.group}, start, end)
		replay(arrivals, start, "")
		wg.Wait()
		select {
		case err := <-errs:
			return err
		default:
		}
		time.Sleep(time.Until(end))
		rec.finish([]string{r.group})
		if err := t.waitEnded(r.group); err != nil {
			return err
		}
		results[r.group] = rec.result(r.group, 3)
		if err := t.drain(ctx, r.group, r.pools...); err != nil {
			return err
		}
	}

	fmt.Println()
	fmt.Println("| pools | claims | warm-hit | wait p50 | wait p99 | idle pod-seconds | pods started |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		res := results[r.group]
		fmt.Printf("| %s | %d | %.1f%% | %s | %s | %.0f | %d |\n", r.group, res.Claims, 100*res.HitRatio(),
			ms(res.WaitP50), ms(res.WaitP99), res.IdlePodSeconds, res.PodsMade)
	}
	var problems []string
	for _, r := range runs {
		if res := results[r.group]; res.Unserved > 0 || res.Failed > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d claims never served, %d did not succeed", r.group, res.Unserved, res.Failed))
		}
	}
	if o.check {
		own, sh := results["per-namespace"], results["shared"]
		if sh.IdlePodSeconds >= own.IdlePodSeconds || sh.HitRatio() < own.HitRatio() {
			problems = append(problems, fmt.Sprintf("the shared pool kept %.0f idle pod-seconds at %.1f%% warm, the pools per namespace %.0f at %.1f%%",
				sh.IdlePodSeconds, 100*sh.HitRatio(), own.IdlePodSeconds, 100*own.HitRatio()))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

func runFairness(cfg *rest.Config, scheme *runtime.Scheme, label string, o options, burst int) error {
	ctx := context.Background()
	rec := newRecorder(time.Now)
	t, cleanup, err := newTenantSetup(ctx, cfg, scheme, rec, 2)
	defer cleanup()
	if err != nil {
		return err
	}
	small, big := t.tenants[0], t.tenants[1]
	const smallRuns, bigLimit, poolMax = 30, 6, 24
	fmt.Printf("\n== %s: fairness on one shared pool (autoscaled, 4 to %d pods): the small tenant runs %d Executions at 1/s; "+
		"the big one, %d Executions of 2 s at once, just before\n", label, poolMax, smallRuns, burst)
	ref := sandboxv1alpha1.PoolReference{Namespace: t.shared, Name: "shared"}
	cases := []struct {
		name    string
		burst   bool
		limit   *int32
		reserve int32
	}{
		{"small tenant alone", false, nil, 0},
		{"with the burst, no limit", true, nil, 0},
		{fmt.Sprintf("with the burst, big limited to %d pods", bigLimit), true, ptr.To[int32](bigLimit), 0},
		{fmt.Sprintf("with the burst, big limited to %d pods, 5 idle pods reserved", bigLimit), true, ptr.To[int32](bigLimit), 5},
	}
	type row struct {
		small   result
		queued  [2]string // the manager's queue: p50, p99
		cold    []float64
		slowest float64
		bigDone time.Duration
	}
	rows := make([]row, len(cases))
	for i, c := range cases {
		// Autoscaled: the big tenant's runs churn through warm pods (each used
		// pod is deleted), and only more warm pods keep some idle for others.
		pool := benchPool(t.shared, "shared", o).Replicas(4).Autoscaling(4, poolMax, o.scaleDownDelay).MaxPods(poolMax).
			Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{}).Obj()
		pool.Spec.Sharing.ReservedIdlePods = c.reserve
		if c.limit != nil {
			pool.Spec.Sharing.Tenants = []sandboxv1alpha1.TenantPolicy{{Namespace: big, Weight: 1,
				Limits: sandboxv1alpha1.TenantLimits{MaxPods: c.limit}}}
		}
		if err := t.create(ctx, "shared", pool); err != nil {
			return err
		}
		fmt.Printf("[%d/%d] %s (up to about 75 s on 2 cores)\n", i+1, len(cases), c.name)
		queuedBefore := queueWait(t.shared, "shared", small)
		errs := make(chan error, 1)
		var wg sync.WaitGroup
		smallGroup, bigGroup := fmt.Sprintf("small-%d", i), fmt.Sprintf("big-%d", i)
		start := time.Now()
		if c.burst {
			for k := range burst {
				t.claim(ctx, &wg, errs, big, fmt.Sprintf("%s-%04d", bigGroup, k), bigGroup, ref, "import time; time.sleep(2)", 0)
			}
		}
		for k := range smallRuns {
			time.Sleep(time.Until(start.Add(time.Duration(k+1) * time.Second)))
			t.claim(ctx, &wg, errs, small, fmt.Sprintf("%s-%04d", smallGroup, k), smallGroup, ref, "pass", 0)
		}
		wg.Wait()
		select {
		case err := <-errs:
			return err
		default:
		}
		if err := t.waitEnded(smallGroup, bigGroup); err != nil {
			return err
		}
		queued := queueWait(t.shared, "shared", small)
		rows[i] = row{small: rec.result(smallGroup, 1), cold: rec.coldAt(smallGroup, start),
			slowest: rec.slowestAt(smallGroup, start), bigDone: time.Since(start),
			queued: [2]string{quantileBound(queuedBefore, queued, 0.5), quantileBound(queuedBefore, queued, 0.99)}}
		if err := t.drain(ctx, "shared", pool); err != nil {
			return err
		}
	}
	fmt.Println()
	fmt.Println("| case | small tenant's claims | warm-hit | wait p50 | wait p99 | in the manager's queue p50 / p99 | wait max, made at | its cold claims made at | all done after |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---|---:|")
	var problems []string
	for i, c := range cases {
		r := rows[i].small
		cold := make([]string, len(rows[i].cold))
		for k, at := range rows[i].cold {
			cold[k] = fmt.Sprintf("%.0f", at)
		}
		at := "-"
		if len(cold) > 0 {
			at = strings.Join(cold, ", ") + " s"
		}
		fmt.Printf("| %s | %d | %.1f%% | %s | %s | %s / %s | %s, %.0f s | %s | %.0f s |\n", c.name, r.Claims, 100*r.HitRatio(), ms(r.WaitP50), ms(r.WaitP99),
			rows[i].queued[0], rows[i].queued[1], ms(r.WaitMax), rows[i].slowest, at, rows[i].bigDone.Seconds())
		if r.Unserved > 0 || r.Failed > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d of the small tenant's claims never served, %d did not succeed", c.name, r.Unserved, r.Failed))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// queueWait reads the manager's histogram of a tenant's waits in its queue
// (warmpool_pool_tenant_queue_wait_seconds; the manager runs in this process).
func queueWait(ns, pool, tenant string) *dto.Histogram {
	m := &dto.Metric{}
	if err := metrics.PoolTenantQueueWait.WithLabelValues(ns, pool, tenant).(prometheus.Metric).Write(m); err != nil {
		return &dto.Histogram{}
	}
	return m.GetHistogram()
}

// quantileBound is the bucket bound under which the q quantile of the
// observations made between before and after lies ("≤ 4 ms"): a histogram
// tells no more.
func quantileBound(before, after *dto.Histogram, q float64) string {
	if after.GetSampleCount() < before.GetSampleCount() {
		before = &dto.Histogram{} // the series was deleted with an earlier pool of the name in between
	}
	n := after.GetSampleCount() - before.GetSampleCount()
	if n == 0 {
		return "-"
	}
	prev := map[float64]uint64{}
	for _, b := range before.GetBucket() {
		prev[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for _, b := range after.GetBucket() {
		if float64(b.GetCumulativeCount()-prev[b.GetUpperBound()]) >= q*float64(n) {
			return "≤ " + ms(time.Duration(b.GetUpperBound()*float64(time.Second)))
		}
	}
	return "> " + ms(time.Duration(after.GetBucket()[len(after.GetBucket())-1].GetUpperBound()*float64(time.Second)))
}
