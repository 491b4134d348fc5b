// Command load measures Execution create -> Succeeded on envtest: a real
// kube-apiserver and etcd, the real manager, and real agents as local
// processes (the local kubelet stand-in). It prints latency percentiles and the
// sustained rate, for docs/performance.md.
//
//	go run ./test/load -executions 1000 -pool 10 -concurrency 20 -mode never
//	go run ./test/load -executions 1000 -pool 10 -concurrency 10 -mode sessions
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func main() {
	n := flag.Int("executions", 1000, "Executions to run")
	poolSize := flag.Int("pool", 10, "warm pool replicas")
	concurrency := flag.Int("concurrency", 20, "Executions in flight at once")
	mode := flag.String("mode", "never", "never: every Execution on a fresh pod (reusePolicy Never); sessions: one session per in-flight slot, no pod churn")
	python := flag.String("python", "", "interpreter for the agents (default: /usr/bin/python3 when present, else python3)")
	flag.Parse()
	if *python == "" {
		if _, err := os.Stat("/usr/bin/python3"); err == nil {
			*python = "/usr/bin/python3"
		}
	}
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))
	if err := run(*n, *poolSize, *concurrency, *mode, *python); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func opts(env *testenv.Env) ctrl.Options {
	return ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}}
}

func run(n, poolSize, concurrency int, mode, python string) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	// Registered after env.Stop, so it runs before it: managers stop before the API server.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := env.Client
	if err := c.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "warmpool-load-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	agent := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", agent, "./cmd/agent")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build agent: %v\n%s", err, out)
	}

	kmgr, err := ctrl.NewManager(env.Config, opts(env))
	if err != nil {
		return err
	}
	kubelet := &localkubelet.Kubelet{Client: kmgr.GetClient(), AgentBinary: agent, Dir: dir, Python: python, Log: ctrl.Log}
	if err := kubelet.SetupWithManager(kmgr); err != nil {
		return err
	}
	defer kubelet.StopAll()
	go func() { _ = kmgr.Start(ctx) }()

	mopts := opts(env)
	cfg := controller.Config{ManagerNamespace: "default", Resolver: kubelet}
	mopts.Cache = controller.CacheOptions(cfg.KeysSecret())
	mgr, err := ctrl.NewManager(env.Config, mopts)
	if err != nil {
		return err
	}
	if err := controller.Setup(ctx, mgr, cfg); err != nil {
		return err
	}
	go func() { _ = mgr.Start(ctx) }()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "load"}}
	if err := c.Create(ctx, ns); err != nil {
		return err
	}
	pool := wrappers.Pool("load", "python").Replicas(int32(poolSize)).Obj()
	if err := c.Create(ctx, pool); err != nil {
		return err
	}
	start := time.Now()
	for {
		p := &sandboxv1alpha1.SandboxPool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), p); err == nil && p.Status.IdleReplicas >= int32(poolSize) {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("pool never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("pool of %d ready in %s (python %q)\n", poolSize, time.Since(start).Round(time.Millisecond), python)

	// Completions are observed through a watch, as `kubectl wait` would.
	var mu sync.Mutex
	done := map[string]chan time.Time{}
	waiter := func(name string) chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		if done[name] == nil {
			done[name] = make(chan time.Time, 1)
		}
		return done[name]
	}
	informers, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	inf, err := informers.GetInformer(ctx, &sandboxv1alpha1.Execution{})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	onUpdate := func(obj any) {
		ex := obj.(*sandboxv1alpha1.Execution)
		if !ex.Status.Phase.IsFinished() {
			return
		}
		mu.Lock()
		first := !seen[ex.Name]
		seen[ex.Name] = true
		mu.Unlock()
		if first {
			if ex.Status.Phase != sandboxv1alpha1.PhaseSucceeded {
				fmt.Fprintf(os.Stderr, "%s ended %s: %+v\n", ex.Name, ex.Status.Phase, ex.Status.Error)
			}
			waiter(ex.Name) <- time.Now()
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onUpdate, UpdateFunc: func(_, o any) { onUpdate(o) },
	}); err != nil {
		return err
	}
	go func() { _ = informers.Start(ctx) }()
	informers.WaitForCacheSync(ctx)

	lat := make([]time.Duration, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	begin := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				for range jobs { // after an error: let the feeder finish instead of blocking on it
				}
			}()
			for i := range jobs {
				name := fmt.Sprintf("ex-%05d", i)
				ex := wrappers.Execution("load", name).Code("print(1)").Obj()
				if mode == "sessions" {
					ex.Spec.Session = fmt.Sprintf("s%d", w)
				}
				t0 := time.Now()
				ch := waiter(name)
				if err := c.Create(ctx, ex); err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
					return
				}
				select {
				case t1 := <-ch:
					lat[i] = t1.Sub(t0)
				case <-time.After(2 * time.Minute):
					got := &sandboxv1alpha1.Execution{}
					_ = c.Get(ctx, client.ObjectKeyFromObject(ex), got)
					errMu.Lock()
					firstErr = fmt.Errorf("%s did not finish: %+v", name, got.Status)
					errMu.Unlock()
					return
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	total := time.Since(begin)
	if firstErr != nil {
		return firstErr
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) time.Duration { return lat[int(q*float64(n-1))].Round(100 * time.Microsecond) }
	fmt.Printf("mode=%s executions=%d pool=%d concurrency=%d\n", mode, n, poolSize, concurrency)
	fmt.Printf("create->Succeeded p50=%s p90=%s p99=%s max=%s\n", pct(0.5), pct(0.9), pct(0.99), lat[n-1].Round(time.Millisecond))
	fmt.Printf("sustained: %.1f executions/s over %s; agents started: %d\n", float64(n)/total.Seconds(), total.Round(time.Millisecond), kubelet.Started())
	return nil
}
