// Command autoscalebench replays a seeded trace of claims (Poisson arrivals
// with bursts and a quiet stretch) against four pools at once, one per way of
// sizing a warm pool, and reports side by side the share of claims that
// found a warm pod, the wait for a pod (p50, p99) and the idle pod-seconds:
//
//   - fixed-peak: replicas fixed at the 99% Poisson quantile of the peak
//     rate × the start-up time;
//   - fixed-mean: replicas fixed at the mean rate × the start-up time;
//   - rate-x-t: replicas set every 15 s through the /scale subresource to
//     the last minute's claim rate × the start-up time, held for the
//     scale-down delay before it goes down (the HPA/KEDA rule peers
//     document, with the HPA's sync period and scale-down stabilisation);
//     -covers adds variants with k start-up times of cover (rate-x-kt);
//   - autoscaler: spec.autoscaling (target 0.99, the same scale-down delay);
//     -targets adds variants with other targets.
//
// The start-up time the fixed sizes and the rate × T rule use is measured
// first (creation to Ready of a few pods); the autoscaler measures its own.
// Each pool first gets a minute (-warmup) of the first phase's demand, not
// measured, so the autoscaler meets the trace as a pool that has been
// running (the fixed sizes are computed from the trace itself). All pools
// see the same arrivals at the same moments, so whatever slows the machine
// slows them alike; -sequential replays the same arrivals to one pool at a
// time instead, for a node that cannot start every pool's pods at once
// (gVisor on two cores). Every time is taken on this side from
// watch events: a claim is warm when its pod was seen Ready before the claim
// was created; its wait runs from the create call to the claim of its pod.
//
// By default it runs on envtest (the test kubelet runs real agents with a
// real python3 and holds each pod back -envtest-delays before it starts, as
// an image pull and a sandbox boot would); with -cluster, on the cluster in
// KUBECONFIG with the operator deployed. It writes an SVG of each run and
// fails when a claim was not served or did not succeed.
//
//	go run ./test/autoscalebench -trace full -envtest-delays 2s,10s -plot-dir docs
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/autoscale"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const (
	target = 0.99
	// hpaPeriod is the HPA controller's sync period (and close to KEDA's 30 s polling).
	hpaPeriod = 15 * time.Second
	// rateWindow is the rate() window of the rule's query.
	rateWindow = time.Minute
)

type options struct {
	trace          string
	seed           int64
	scaleDownDelay time.Duration
	plotDir        string
	image          string
	runtimeClass   string
	check          bool
	sequential     bool
	warmup         time.Duration
	covers         []float64 // the rate × T rule's seconds of cover, in start-up times
	targets        []string  // the autoscaler's targetWarmRatio
}

func main() {
	var o options
	delays := flag.String("envtest-delays", "2s,10s", "pod start-up delays of the test kubelet, one envtest run each")
	onCluster := flag.Bool("cluster", false, "run on the cluster in KUBECONFIG (operator deployed) instead of envtest")
	flag.StringVar(&o.trace, "trace", "full", "trace shape: full, short or cluster")
	flag.Int64Var(&o.seed, "seed", 1, "seed of the arrivals")
	flag.DurationVar(&o.scaleDownDelay, "scale-down-delay", 30*time.Second, "the autoscaler's scaleDownDelay and the rule's stabilisation window")
	flag.StringVar(&o.plotDir, "plot-dir", "", "write autoscaling-<run>.svg here")
	flag.StringVar(&o.image, "image", "warmpool.dev/repl:dev", "sandbox image (-cluster)")
	flag.StringVar(&o.runtimeClass, "runtime-class", "gvisor", "RuntimeClass of the pools (-cluster)")
	flag.BoolVar(&o.check, "check", false, "also fail unless the autoscaler kept fewer idle pod-seconds than fixed-peak")
	flag.BoolVar(&o.sequential, "sequential", false, "replay the trace to one pool at a time (the same arrivals), for a node that cannot start every pool's pods at once")
	flag.DurationVar(&o.warmup, "warmup", time.Minute, "the first phase's demand before the trace, not measured")
	covers := flag.String("covers", "1", "variants of the rate × T rule: seconds of cover in start-up times (1: T itself)")
	targets := flag.String("targets", "0.99", "variants of the autoscaler: targetWarmRatio")
	tenants := flag.Int("tenants", 0, "instead: N tenant namespaces' bursty traces, N pools per namespace against one shared pool (first -envtest-delays)")
	fairness := flag.Bool("fairness", false, "instead: a small tenant's waits on a shared pool alone and during another tenant's burst (first -envtest-delays)")
	burst := flag.Int("burst", 200, "the big tenant's burst of -fairness")
	flag.Parse()
	quietKlog()
	logf.SetLogger(logr.Discard()) // the manager's and the kubelet's logs (envtest) stay off the report
	for _, c := range strings.Split(*covers, ",") {
		k, err := strconv.ParseFloat(strings.TrimSpace(c), 64)
		if err != nil || k <= 0 {
			fail(fmt.Errorf("-covers: %q is no positive number", c))
		}
		o.covers = append(o.covers, k)
	}
	o.targets = strings.Split(*targets, ",")
	if _, ok := traces[o.trace]; !ok {
		fail(fmt.Errorf("no trace %q", o.trace))
	}
	if *onCluster {
		cfg, err := config.GetConfig()
		if err != nil {
			fail(err)
		}
		scheme := runtime.NewScheme()
		fail(clientgoscheme.AddToScheme(scheme))
		fail(sandboxv1alpha1.AddToScheme(scheme))
		fail(runOn(cfg, scheme, "cluster", o))
		return
	}
	for _, d := range strings.Split(*delays, ",") {
		delay, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			fail(err)
		}
		o.image, o.runtimeClass = "warmpool.dev/repl:test", "gvisor"
		var run runner = runOn
		switch {
		case *tenants > 0:
			run = func(cfg *rest.Config, scheme *runtime.Scheme, label string, o options) error {
				return runTenants(cfg, scheme, label, o, *tenants)
			}
		case *fairness:
			run = func(cfg *rest.Config, scheme *runtime.Scheme, label string, o options) error {
				return runFairness(cfg, scheme, label, o, *burst)
			}
		}
		if err := onEnvtest(delay, o, run); err != nil {
			fail(err)
		}
		if *tenants > 0 || *fairness {
			return // one delay is enough: these compare pools, not start-up times
		}
	}
}

// quietKlog keeps the data plane's API server logs (klog) off the report.
func quietKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "autoscalebench:", err)
		os.Exit(1)
	}
}

type runner func(cfg *rest.Config, scheme *runtime.Scheme, label string, o options) error

func onEnvtest(delay time.Duration, o options, run runner) error {
	s, err := stack.Start(stack.Options{PodStartDelay: delay})
	if err != nil {
		return fmt.Errorf("start warmpool on envtest: %w", err)
	}
	defer s.Stop()
	return run(s.Env.Config, s.Env.Scheme, "envtest-"+delay.String(), o)
}

type strategy struct {
	name  string
	pool  *sandboxv1alpha1.SandboxPool
	cover float64 // > 0: sized from here by the rule rate × cover·T
	auto  bool    // the built-in autoscaler
}

// sample is a pool's idle pods and replicas at one moment of the trace.
type sample struct {
	at       time.Duration
	idle     int
	replicas int32
}

func runOn(cfg *rest.Config, scheme *runtime.Scheme, label string, o options) error {
	ctx := context.Background()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "autoscalebench-"}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer func() { _ = c.Delete(context.Background(), ns) }()

	rec := newRecorder(time.Now)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := watch(wctx, cfg, scheme, rec, ns.Name); err != nil {
		return err
	}

	phases := traces[o.trace]
	arrivals := generate(phases, o.seed)
	startup, err := measureStartup(ctx, c, rec, ns.Name, o)
	if err != nil {
		return err
	}
	T := startup.Seconds()
	peak := int32(autoscale.PoissonQuantile(peakRate(phases)*T, target))
	mean := int32(max(1, math.Ceil(meanRate(phases)*T)))
	maxReplicas := 2 * peak
	fmt.Printf("\n== %s: trace %q (%s; %d claims, seed %d), start-up %.2fs measured: fixed-peak %d, fixed-mean %d, max %d, scale-down delay %s\n",
		label, o.trace, describe(phases), len(arrivals), o.seed, T, peak, mean, maxReplicas, o.scaleDownDelay)

	base := func(name string) *wrappers.PoolWrapper {
		w := wrappers.Pool(ns.Name, name).Image(o.image).RuntimeClass(o.runtimeClass)
		// Small memory requests, and the CPU one fixed at the default of
		// today: the pools together hold many pods, and an unschedulable pod
		// would measure the scheduler, not the sizing.
		w.Spec.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
		}
		return w
	}
	strategies := []strategy{
		{name: "fixed-peak", pool: base("fixed-peak").Replicas(peak).Obj()},
		{name: "fixed-mean", pool: base("fixed-mean").Replicas(mean).Obj()},
	}
	for _, k := range o.covers {
		name := "rate-x-t"
		if k != 1 {
			name = fmt.Sprintf("rate-x-%gt", k)
		}
		strategies = append(strategies, strategy{name: name, pool: base(name).Replicas(mean).Obj(), cover: k})
	}
	for i, t := range o.targets {
		name := "autoscaler"
		if i > 0 {
			name = "autoscaler-" + strings.TrimPrefix(t, "0.")
		}
		pool := base(name).Replicas(1).Autoscaling(1, maxReplicas, o.scaleDownDelay).Obj()
		pool.Spec.Autoscaling.TargetWarmRatio = t
		strategies = append(strategies, strategy{name: name, pool: pool, auto: true})
	}
	samples := make([][]sample, len(strategies))
	b := &bench{c: c, rec: rec, ns: ns.Name, startup: startup, maxReplicas: maxReplicas, o: o, phases: phases, arrivals: arrivals}
	if o.sequential {
		for i := range strategies {
			if err := b.replay(ctx, strategies[i:i+1], samples[i:i+1], true); err != nil {
				return err
			}
		}
	} else if err := b.replay(ctx, strategies, samples, false); err != nil {
		return err
	}

	results := make([]result, len(strategies))
	for i, s := range strategies {
		results[i] = rec.result(s.pool.Name, len(phases))
	}
	report(strategies, results, phases)
	if o.plotDir != "" {
		path := filepath.Join(o.plotDir, "autoscaling-"+label+".svg")
		title := fmt.Sprintf("%s: trace %q, seed %d, start-up %.1fs", label, o.trace, o.seed, T)
		if err := os.WriteFile(path, []byte(plot(title, strategies, samples, arrivals, length(phases))), 0o644); err != nil {
			return err
		}
		fmt.Println("plot:", path)
	}
	var problems []string
	for i, r := range results {
		if r.Unserved > 0 || r.Failed > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d claims never served, %d did not succeed", strategies[i].name, r.Unserved, r.Failed))
		}
	}
	for i, s := range strategies {
		if o.check && s.auto && results[i].IdlePodSeconds >= results[0].IdlePodSeconds {
			problems = append(problems, fmt.Sprintf("%s kept %.0f idle pod-seconds, fixed-peak %.0f",
				s.name, results[i].IdlePodSeconds, results[0].IdlePodSeconds))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

type bench struct {
	c           client.Client
	rec         *recorder
	ns          string
	startup     time.Duration
	maxReplicas int32
	o           options
	phases      []phase
	arrivals    []arrival
}

// replay creates the pools of group, gives them the warm-up and then the
// trace, and waits for every claim to end; with clear, it then scales them
// to zero so that the next group meets an idle machine.
func (b *bench) replay(ctx context.Context, group []strategy, samples [][]sample, clear bool) error {
	c, rec := b.c, b.rec
	var pools []string
	for _, s := range group {
		if err := c.Create(ctx, s.pool); err != nil {
			return fmt.Errorf("create pool %s: %w", s.name, err)
		}
		pools = append(pools, s.pool.Name)
	}
	for _, s := range group {
		if err := waitIdle(ctx, rec, s.pool.Name, int(s.pool.Spec.Replicas), 3*time.Minute); err != nil {
			return err
		}
	}
	tctx, tstop := context.WithCancel(ctx)
	defer tstop()
	var wg sync.WaitGroup
	for _, s := range group {
		if s.cover > 0 {
			wg.Add(1)
			cover := time.Duration(s.cover * float64(b.startup))
			go func() { defer wg.Done(); rateTimesT(tctx, c, rec, s.pool, cover, b.maxReplicas, b.o.scaleDownDelay) }()
		}
	}
	var creates sync.WaitGroup
	var createErr error
	var emu sync.Mutex
	claims := func(arrivals []arrival, start time.Time, prefix string) {
		for i, a := range arrivals {
			time.Sleep(time.Until(start.Add(a.At)))
			for _, s := range group {
				name := fmt.Sprintf("%s-%s%04d", s.name, prefix, i)
				rec.created(name, s.pool.Name, a.Phase)
				creates.Add(1)
				go func() {
					defer creates.Done()
					ex := wrappers.Execution(b.ns, name).Pool(s.pool.Name).Obj()
					if err := c.Create(ctx, ex); err != nil {
						emu.Lock()
						createErr = fmt.Errorf("create Execution %s: %w", name, err)
						emu.Unlock()
					}
				}()
			}
		}
	}
	// The warm-up: the first phase's demand, not measured, so that every
	// pool meets the trace as one that has been running (the fixed sizes
	// were computed from the trace itself; the autoscaler learns).
	if b.o.warmup > 0 {
		warm := generate([]phase{{"warm-up", b.phases[0].Rate, b.o.warmup.Seconds()}}, b.o.seed+1)
		for i := range warm {
			warm[i].Phase = -1
		}
		claims(warm, time.Now(), "w")
	}

	start := time.Now()
	end := start.Add(length(b.phases))
	rec.begin(pools, start, end)
	wg.Add(1)
	go func() { // one sample a second, for the plot
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			at := time.Since(start)
			for i, s := range group {
				pool := &sandboxv1alpha1.SandboxPool{}
				_ = c.Get(tctx, client.ObjectKeyFromObject(s.pool), pool)
				samples[i] = append(samples[i], sample{at: at, idle: rec.idleNow(s.pool.Name), replicas: pool.Spec.Replicas})
			}
			select {
			case <-tctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	claims(b.arrivals, start, "")
	creates.Wait()
	if createErr != nil {
		return createErr
	}
	time.Sleep(time.Until(end))
	rec.finish(pools)
	tstop()
	wg.Wait()
	deadline := time.Now().Add(3 * time.Minute)
	for rec.pending(pools) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !clear {
		return nil
	}
	for _, s := range group {
		pool := &sandboxv1alpha1.SandboxPool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(s.pool), pool); err != nil {
			return err
		}
		pool.Spec.Autoscaling = nil
		pool.Spec.Replicas = 0
		if err := c.Update(ctx, pool); err != nil {
			return fmt.Errorf("scale pool %s to zero: %w", s.name, err)
		}
		if err := waitIdle(ctx, rec, s.pool.Name, -1, 5*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// watch feeds rec from informers on the namespaces' pods and Executions.
func watch(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, rec *recorder, namespaces ...string) error {
	in := map[string]cache.Config{}
	for _, ns := range namespaces {
		in[ns] = cache.Config{}
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: in})
	if err != nil {
		return err
	}
	pods, err := ca.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	onPod := func(obj any, gone bool) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			rec.onPod(pod, gone)
		}
	}
	if _, err := pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { onPod(obj, false) },
		UpdateFunc: func(_, obj any) { onPod(obj, false) },
		DeleteFunc: func(obj any) { onPod(obj, true) },
	}); err != nil {
		return err
	}
	executions, err := ca.GetInformer(ctx, &sandboxv1alpha1.Execution{})
	if err != nil {
		return err
	}
	onEx := func(obj any) {
		if ex, ok := obj.(*sandboxv1alpha1.Execution); ok {
			rec.onExecution(ex)
		}
	}
	if _, err := executions.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onEx, UpdateFunc: func(_, obj any) { onEx(obj) },
	}); err != nil {
		return err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return fmt.Errorf("caches did not sync")
	}
	return nil
}

// measureStartup is the median creation to Ready of a fresh pool's pods.
func measureStartup(ctx context.Context, c client.Client, rec *recorder, ns string, o options) (time.Duration, error) {
	const n = 3
	pool := wrappers.Pool(ns, "calibrate").Image(o.image).RuntimeClass(o.runtimeClass).Replicas(n).Obj()
	if err := c.Create(ctx, pool); err != nil {
		return 0, fmt.Errorf("create pool calibrate: %w", err)
	}
	if err := waitIdle(ctx, rec, pool.Name, n, 3*time.Minute); err != nil {
		return 0, err
	}
	starts := rec.startups(pool.Name)
	// Scaled to zero before it goes: envtest has no garbage collector to
	// delete the pods of a deleted pool.
	if err := c.Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))); err != nil {
		return 0, err
	}
	if err := waitIdle(ctx, rec, pool.Name, -n, 2*time.Minute); err != nil {
		return 0, err
	}
	if err := c.Delete(ctx, pool); err != nil {
		return 0, err
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	return quantile(starts, 0.5), nil
}

// waitIdle waits until the pool has n idle pods (n < 0: until it has none
// left at all, of -n it had).
func waitIdle(ctx context.Context, rec *recorder, pool string, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		idle := rec.idleNow(pool)
		if (n >= 0 && idle >= n) || (n < 0 && rec.podsOf(pool) == 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s: %d idle pods after %s, waiting for %d", pool, idle, limit, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rateTimesT is the rule peers document for an HPA or KEDA: every sync
// period, replicas = ceil(claims per second over the last minute × T),
// through the /scale subresource; a lower value waits out the stabilisation
// window (the largest recommendation of that span holds), as the HPA's
// scale-down behaviour does.
func rateTimesT(ctx context.Context, c client.Client, rec *recorder, pool *sandboxv1alpha1.SandboxPool, cover time.Duration, maxReplicas int32, stabilise time.Duration) {
	type rec_ struct {
		at time.Time
		n  int32
	}
	var history []rec_
	tick := time.NewTicker(hpaPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		rate := float64(rec.since(pool.Name, now.Add(-rateWindow))) / rateWindow.Seconds()
		want := min(max(1, int32(math.Ceil(rate*cover.Seconds()))), maxReplicas)
		history = append(history, rec_{now, want})
		for len(history) > 0 && now.Sub(history[0].at) > stabilise {
			history = history[1:]
		}
		for _, h := range history {
			want = max(want, h.n)
		}
		// As the HPA, on the scale subresource; the pool's status writes
		// change its resourceVersion, so a conflict is tried again.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			scale := &autoscalingv1.Scale{}
			if err := c.SubResource("scale").Get(ctx, pool, scale); err != nil {
				return err
			}
			if scale.Spec.Replicas == want {
				return nil
			}
			scale.Spec.Replicas = want
			return c.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))
		})
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "rate × T: scale:", err)
		}
	}
}

func report(strategies []strategy, results []result, phases []phase) {
	fmt.Println()
	fmt.Println("| sizing | claims | warm-hit | wait p50 | wait p99 | wait max | idle pod-seconds | pods started | their start-up p50, p90 |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, s := range strategies {
		r := results[i]
		fmt.Printf("| %s | %d | %.1f%% | %s | %s | %s | %.0f | %d | %.1f s, %.1f s |\n", s.name, r.Claims, 100*r.HitRatio(),
			ms(r.WaitP50), ms(r.WaitP99), ms(r.WaitMax), r.IdlePodSeconds, r.PodsMade, r.StartP50.Seconds(), r.StartP90.Seconds())
	}
	fmt.Println()
	header := "| warm-hit by phase |"
	line := "|---|"
	for _, p := range phases {
		header += fmt.Sprintf(" %s %g/s |", p.Name, p.Rate)
		line += "---:|"
	}
	fmt.Println(header)
	fmt.Println(line)
	for i, s := range strategies {
		row := "| " + s.name + " |"
		for j := range phases {
			if n := results[i].PhaseClaims[j]; n > 0 {
				row += fmt.Sprintf(" %d/%d |", results[i].PhaseWarm[j], n)
			} else {
				row += " - |"
			}
		}
		fmt.Println(row)
	}
}

func ms(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
