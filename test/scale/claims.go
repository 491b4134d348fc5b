package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// client returns a client of the admin's without client-go's default rate
// limit: the load generator must not be what holds the load back.
func (e *env) client() (client.Client, *rest.Config, error) {
	cfg := rest.CopyConfig(e.cluster.env.Config)
	cfg.QPS, cfg.Burst = 5000, 10000
	c, err := client.New(cfg, client.Options{Scheme: e.cluster.env.Scheme})
	return c, cfg, err
}

// warmPool creates a pool of size warm pods in namespace and waits until
// they are idle; it returns how long that took.
func (e *env) warmPool(ctx context.Context, c client.Client, ns, name string, size int, maxPods bool) (time.Duration, error) {
	start := time.Now()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		return 0, err
	}
	pool := wrappers.Pool(ns, name).Replicas(int32(size))
	if maxPods {
		pool = pool.MaxPods(int32(size))
	}
	if err := c.Create(ctx, pool.Obj()); err != nil {
		return 0, fmt.Errorf("create pool %s/%s: %w", ns, name, err)
	}
	var pr progress
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		var p sandboxv1alpha1.SandboxPool
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false, nil
		}
		pr.say("pool %s: %d of %d pods idle", name, p.Status.IdleReplicas, size)
		return int(p.Status.IdleReplicas) >= size, nil
	})
	return time.Since(start), err
}

// sessionWatch records when each Session (namespace/name) of a namespace
// (or of all: "") was first seen Ready, and which were seen Lost.
type sessionWatch struct {
	mu    sync.Mutex
	ready map[string]time.Time
	lost  map[string]string
	// lostAt is when each Lost Session was first seen Lost.
	lostAt map[string]time.Time
	stop   context.CancelFunc
}

func (e *env) watchSessions(ctx context.Context, cfg *rest.Config, ns string) (*sessionWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	sw := &sessionWatch{ready: map[string]time.Time{}, lost: map[string]string{}, lostAt: map[string]time.Time{}, stop: cancel}
	opts := cache.Options{Scheme: e.cluster.env.Scheme}
	if ns != "" {
		opts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	}
	ca, err := cache.New(cfg, opts)
	if err != nil {
		cancel()
		return nil, err
	}
	inf, err := ca.GetInformer(ctx, &sandboxv1alpha1.Session{})
	if err != nil {
		cancel()
		return nil, err
	}
	seen := func(obj any) {
		now := time.Now()
		s, ok := obj.(*sandboxv1alpha1.Session)
		if !ok {
			return
		}
		key := s.Namespace + "/" + s.Name
		sw.mu.Lock()
		defer sw.mu.Unlock()
		switch s.Status.Phase {
		case sandboxv1alpha1.SessionReady:
			if _, ok := sw.ready[key]; !ok {
				sw.ready[key] = now
			}
		case sandboxv1alpha1.SessionLost:
			sw.lost[key] = string(s.Status.Phase)
			if _, ok := sw.lostAt[key]; !ok {
				sw.lostAt[key] = now
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("the Session watch did not sync")
	}
	return sw, nil
}

func (sw *sessionWatch) count() (ready, lost int) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return len(sw.ready), len(sw.lost)
}

// arrivals returns the offsets of a Poisson process of rate per second over d.
func arrivals(seed int64, rate float64, d time.Duration) []time.Duration {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5ca1e))
	var out []time.Duration
	for t := 0.0; ; {
		t += rng.ExpFloat64() / rate
		at := time.Duration(t * float64(time.Second))
		if at >= d {
			return out
		}
		out = append(out, at)
	}
}

// offer creates objects at the given offsets (open loop: a slow create does
// not delay the next) and returns when each create call started.
func offer(ctx context.Context, at []time.Duration, create func(ctx context.Context, i int) error) ([]time.Time, []error) {
	started := make([]time.Time, len(at))
	errs := make([]error, len(at))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, off := range at {
		if d := time.Until(t0.Add(off)); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return started, errs
			case <-time.After(d):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			started[i] = time.Now()
			errs[i] = create(ctx, i)
		}()
	}
	wg.Wait()
	return started, errs
}

// claims is agent-sandbox's pull-request gate, translated: one pool of warm
// pods, Sessions created at a Poisson rate, each one's create → Ready.
func claims(ctx context.Context, e *env) (*report, error) {
	o := e.o
	rep := newReport("claims")
	rep.param("nodes", o.nodes)
	rep.param("warm pods", o.warm)
	rep.param("rate (Sessions/s, Poisson)", o.rate)
	rep.param("duration", o.duration)
	rep.param("seed", o.seed)
	rep.param("pods started during the claims (the pool refills)", !o.noRefill)
	m, c, cfg, err := e.managerAndClient()
	if err != nil {
		return nil, err
	}
	defer m.stop(10 * time.Second)
	const ns, pool = "scale-claims", "python"
	fillTime, err := e.warmPool(ctx, c, ns, pool, o.warm, o.noRefill)
	if err != nil {
		return nil, fmt.Errorf("fill the pool of %d: %w", o.warm, err)
	}
	rep.Values["fill_seconds"] = fillTime.Seconds()
	fmt.Fprintf(os.Stderr, "scale: %d warm pods in %s\n", o.warm, fillTime.Round(time.Millisecond))
	sw, err := e.watchSessions(ctx, cfg, ns)
	if err != nil {
		return nil, err
	}
	defer sw.stop()

	at := arrivals(o.seed, o.rate, o.duration)
	if len(at) > o.warm {
		return nil, fmt.Errorf("%d Sessions would arrive for %d warm pods: raise -warm", len(at), o.warm)
	}
	before, err := m.scrape()
	if err != nil {
		return nil, err
	}
	u0, _ := procUsage(m.cmd.Process.Pid)
	cpu0 := processCPU()
	go e.profiles(ctx, m, "load", int(o.duration.Seconds())+2)
	t0 := time.Now()
	started, errs := offer(ctx, at, func(ctx context.Context, i int) error {
		return c.Create(ctx, wrappers.Session(ns, fmt.Sprintf("s-%05d", i)).Pool(pool).Obj())
	})
	offered := time.Since(t0)
	var createErrs int
	for i, err := range errs {
		if err != nil {
			createErrs++
			if createErrs <= 3 {
				fmt.Fprintf(os.Stderr, "scale: create Session %d: %v\n", i, err)
			}
		}
	}
	want := len(at) - createErrs
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		r, l := sw.count()
		return r+l >= want, nil
	})
	after, err := m.scrape()
	if err != nil {
		return nil, err
	}
	u1, _ := procUsage(m.cmd.Process.Pid)
	cpu1 := processCPU()
	elapsed := time.Since(t0)

	sw.mu.Lock()
	var lat []time.Duration
	for i, s := range started {
		if t, ok := sw.ready[fmt.Sprintf("%s/s-%05d", ns, i)]; ok && errs[i] == nil {
			lat = append(lat, t.Sub(s))
		}
	}
	lost := len(sw.lost)
	sw.mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p90, p99 := percentile(lat, 50), percentile(lat, 90), percentile(lat, 99)
	if o.plot != "" {
		title := fmt.Sprintf("%d Sessions at %.0f/s on %d kwok nodes, pool of %d: p50 %s, p99 %s", len(lat), o.rate, o.nodes, o.warm, ms(p50), ms(p99))
		if err := os.WriteFile(o.plot, []byte(cdfPlot(title, lat, o.gateP99)), 0o644); err != nil {
			return nil, err
		}
	}
	rep.Values["offered"] = float64(len(at))
	rep.Values["ready"] = float64(len(lat))
	rep.Values["lost"] = float64(lost)
	rep.Values["create_errors"] = float64(createErrs)
	rep.Values["rate_achieved"] = float64(len(at)) / offered.Seconds()
	rep.Values["client_p50_ms"] = float64(p50.Microseconds()) / 1000
	rep.Values["client_p90_ms"] = float64(p90.Microseconds()) / 1000
	rep.Values["client_p99_ms"] = float64(p99.Microseconds()) / 1000
	rep.Values["client_max_ms"] = float64(percentile(lat, 100).Microseconds()) / 1000
	mq := func(q float64) float64 { return quantile(q, "warmpool_session_ready_seconds", before, after) }
	lq := func(q float64) float64 { return quantile(q, "warmpool_session_lease_seconds", before, after) }
	rep.Values["manager_p50_ms"], rep.Values["manager_p90_ms"], rep.Values["manager_p99_ms"] = mq(.5)*1000, mq(.9)*1000, mq(.99)*1000
	rep.Tables = append(rep.Tables, table{
		Title:  fmt.Sprintf("Session create → Ready, %d Sessions offered at %.0f/s (achieved %.1f/s), %d Ready, %d Lost, %d create errors", len(at), o.rate, rep.Values["rate_achieved"], len(lat), lost, createErrs),
		Header: []string{"measured by", "p50", "p90", "p99", "max"},
		Rows: [][]string{
			{"client: create call → Ready seen by its watch", ms(p50), ms(p90), ms(p99), ms(percentile(lat, 100))},
			{"manager: warmpool_session_ready_seconds (watch event → Ready stored; histogram estimate)", msf(mq(.5)), msf(mq(.9)), msf(mq(.99)), ""},
			{"manager: warmpool_session_lease_seconds (the lease alone)", msf(lq(.5)), msf(lq(.9)), msf(lq(.99)), ""},
		},
	})
	secs := elapsed.Seconds()
	req := apiRequests(before, after)
	rep.Tables = append(rep.Tables, apiTable("The manager's requests to kube-apiserver during the run", req, secs, float64(len(lat)), "per Session"))
	poolRuns := reconciles(before, after, "sandboxpool")
	rep.Values["pool_reconciles"] = poolRuns
	rep.Tables = append(rep.Tables, table{Title: "The manager process during the run",
		Header: []string{"CPU (cores, average)", "RSS at the end", "peak RSS", "pool reconciles (per second)"},
		Rows: [][]string{{fmt.Sprintf("%.2f", (u1.cpu-u0.cpu).Seconds()/secs), mib(u1.rss), mib(u1.hwm),
			fmt.Sprintf("%.0f (%.1f)", poolRuns, poolRuns/secs)}}})
	rep.Tables = append(rep.Tables, cpuTable("CPU by process during the run (the machine has 2 cores)", cpu0, cpu1, secs))
	rep.Values["manager_cpu_cores"] = (u1.cpu - u0.cpu).Seconds() / secs
	rep.Values["manager_rss_bytes"] = float64(u1.rss)

	var gateErr error
	switch {
	case len(lat) < len(at):
		gateErr = fmt.Errorf("%d of %d Sessions were not Ready within a minute (%d Lost, %d create errors)", len(at)-len(lat), len(at), lost, createErrs)
	case o.gateP99 > 0 && p99 > o.gateP99:
		gateErr = latencyMissed{fmt.Errorf("create → Ready p99 %s is above the gate's %s", ms(p99), o.gateP99)}
	case o.gateP50 > 0 && p50 > o.gateP50:
		gateErr = latencyMissed{fmt.Errorf("create → Ready p50 %s is above the gate's %s", ms(p50), o.gateP50)}
	}
	if o.gateP99 > 0 {
		verdict := "passed"
		if gateErr != nil {
			verdict = "FAILED: " + gateErr.Error()
		}
		rep.note("Gate (p99 ≤ %s): %s.", o.gateP99, verdict)
	}
	return rep, gateErr
}
