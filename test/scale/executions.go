package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// executionWatch records when each Execution (by namespace/name) ended, and how.
type executionWatch struct {
	mu    sync.Mutex
	ended map[string]time.Time
	phase map[string]sandboxv1alpha1.ExecutionPhase
	wrong int
	// why counts the errors of the Executions that did not succeed.
	why map[string]int
}

func (e *env) watchExecutions(ctx context.Context, want string) (*executionWatch, error) {
	_, cfg, err := e.client()
	if err != nil {
		return nil, err
	}
	ew := &executionWatch{ended: map[string]time.Time{}, phase: map[string]sandboxv1alpha1.ExecutionPhase{}, why: map[string]int{}}
	ca, err := cache.New(cfg, cache.Options{Scheme: e.cluster.env.Scheme})
	if err != nil {
		return nil, err
	}
	inf, err := ca.GetInformer(ctx, &sandboxv1alpha1.Execution{})
	if err != nil {
		return nil, err
	}
	seen := func(obj any) {
		now := time.Now()
		x, ok := obj.(*sandboxv1alpha1.Execution)
		if !ok || !x.Status.Phase.IsFinished() {
			return
		}
		key := x.Namespace + "/" + x.Name
		ew.mu.Lock()
		defer ew.mu.Unlock()
		if _, ok := ew.ended[key]; ok {
			return
		}
		ew.ended[key], ew.phase[key] = now, x.Status.Phase
		if x.Status.Phase == sandboxv1alpha1.PhaseSucceeded && (x.Status.Result != want || x.Status.Stdout != "hello\n") {
			ew.wrong++
		}
		if x.Status.Phase != sandboxv1alpha1.PhaseSucceeded && x.Status.Error != nil {
			msg := x.Status.Error.Message
			if len(msg) > 160 {
				msg = msg[:160] + "…"
			}
			ew.why[x.Status.Error.Type+": "+msg]++
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		return nil, err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the Execution watch did not sync")
	}
	return ew, nil
}

// executions: Executions offered at a Poisson rate over many pools, each
// on a warm pod that is then replaced (reusePolicy Never, the default), or
// reset and reused (-reuse FreshInterpreter).
func executions(ctx context.Context, e *env) (*report, error) {
	o := e.o
	rep := newReport("executions")
	rep.param("nodes", o.nodes)
	rep.param("pools", o.pools)
	rep.param("warm pods per pool", o.poolSize)
	rep.param("rate (Executions/s, Poisson)", o.rate)
	rep.param("duration", o.duration)
	rep.param("reusePolicy", cmp.Or(o.reuse, "Never"))
	m, c, _, err := e.managerAndClient()
	if err != nil {
		return nil, err
	}
	defer m.stop(10 * time.Second)
	t0 := time.Now()
	if err := createPools(ctx, c, "exec", o.pools, o.poolSize, sandboxv1alpha1.ReusePolicy(o.reuse)); err != nil {
		return nil, err
	}
	if err := poolsFull(ctx, c, o.pools, o.poolSize, 30*time.Minute); err != nil {
		return nil, fmt.Errorf("the pools did not fill: %w", err)
	}
	fmt.Fprintf(os.Stderr, "scale: %d pools of %d filled in %s\n", o.pools, o.poolSize, time.Since(t0).Round(time.Millisecond))
	const code, want = "print('hello')\n42", "42"
	ew, err := e.watchExecutions(ctx, want)
	if err != nil {
		return nil, err
	}
	at := arrivals(o.seed, o.rate, o.duration)
	names := make([]string, len(at))
	before, err := m.scrape()
	if err != nil {
		return nil, err
	}
	u0, _ := procUsage(m.cmd.Process.Pid)
	cpu0 := processCPU()
	go e.profiles(ctx, m, "load", int(o.duration.Seconds()))
	start := time.Now()
	started, errs := offer(ctx, at, func(ctx context.Context, i int) error {
		ns := fmt.Sprintf("exec-%04d", i%o.pools)
		names[i] = fmt.Sprintf("%s/x-%06d", ns, i)
		return c.Create(ctx, wrappers.Execution(ns, fmt.Sprintf("x-%06d", i)).Pool("python").Code(code).Obj())
	})
	offered := time.Since(start)
	createErrs := 0
	for _, err := range errs {
		if err != nil {
			createErrs++
		}
	}
	want2 := len(at) - createErrs
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		ew.mu.Lock()
		defer ew.mu.Unlock()
		return len(ew.ended) >= want2, nil
	})
	after, err := m.scrape()
	if err != nil {
		return nil, err
	}
	u1, _ := procUsage(m.cmd.Process.Pid)
	cpu1 := processCPU()

	ew.mu.Lock()
	var lat []time.Duration
	phases := map[sandboxv1alpha1.ExecutionPhase]int{}
	var last time.Time
	for i, s := range started {
		t, ok := ew.ended[names[i]]
		if !ok || errs[i] != nil {
			continue
		}
		lat = append(lat, t.Sub(s))
		phases[ew.phase[names[i]]]++
		if t.After(last) {
			last = t
		}
	}
	wrong := ew.wrong
	for w, n := range ew.why {
		rep.note("%d Executions ended with %s", n, w)
	}
	ew.mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	window := last.Sub(start)
	done := float64(len(lat))
	rep.Values["offered"] = float64(len(at))
	rep.Values["offered_rate"] = float64(len(at)) / offered.Seconds()
	rep.Values["ended"] = done
	rep.Values["succeeded"] = float64(phases[sandboxv1alpha1.PhaseSucceeded])
	rep.Values["sustained_rate"] = done / window.Seconds()
	rep.Values["p50_ms"] = float64(percentile(lat, 50).Microseconds()) / 1000
	rep.Values["p99_ms"] = float64(percentile(lat, 99).Microseconds()) / 1000
	req := apiRequests(before, after)
	writes := req["POST"] + req["PUT"] + req["PATCH"] + req["DELETE"]
	rep.Values["writes_per_execution"] = writes / done
	rep.Values["manager_cpu_cores"] = (u1.cpu - u0.cpu).Seconds() / window.Seconds()
	var others []string
	for p, n := range phases {
		if p != sandboxv1alpha1.PhaseSucceeded {
			others = append(others, fmt.Sprintf("%d %s", n, p))
		}
	}
	sort.Strings(others)
	rep.Tables = append(rep.Tables, table{
		Title: fmt.Sprintf("%d Executions offered at %.0f/s (achieved %.1f/s) over %d pools: %d ended (%d Succeeded %v, %d wrong results, %d create errors)",
			len(at), o.rate, rep.Values["offered_rate"], o.pools, len(lat), phases[sandboxv1alpha1.PhaseSucceeded], others, wrong, createErrs),
		Header: []string{"sustained (ended/s, first create → last end)", "create → final status p50", "p90", "p99", "max", "manager writes per Execution", "manager CPU (cores)"},
		Rows: [][]string{{fmt.Sprintf("%.1f", rep.Values["sustained_rate"]), ms(percentile(lat, 50)), ms(percentile(lat, 90)), ms(percentile(lat, 99)), ms(percentile(lat, 100)),
			fmt.Sprintf("%.2f", rep.Values["writes_per_execution"]), fmt.Sprintf("%.2f", rep.Values["manager_cpu_cores"])}},
	})
	rep.Tables = append(rep.Tables, apiTable("The manager's requests to kube-apiserver during the run", req, window.Seconds(), done, "per Execution"))
	rep.Tables = append(rep.Tables, cpuTable("CPU by process during the run (the machine has 2 cores)", cpu0, cpu1, window.Seconds()))
	if int(done) < len(at)-createErrs || wrong > 0 || phases[sandboxv1alpha1.PhaseSucceeded] != int(done) {
		return rep, fmt.Errorf("%d of %d Executions ended, %d Succeeded, %d with a wrong result", int(done), len(at)-createErrs, phases[sandboxv1alpha1.PhaseSucceeded], wrong)
	}
	return rep, nil
}
