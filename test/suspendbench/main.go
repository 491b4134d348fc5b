// Command suspendbench measures what suspending idle Sessions saves: the
// same seeded trace of Sessions that run bursts of code with idle gaps
// between them is replayed against two pools at once, one whose Sessions
// are suspended after -suspend-after idle (sessionSuspendAfter) and one
// whose are not, and it reports side by side the pod-seconds the Sessions
// held while idle, the pod-seconds of every pod of the pool (the warm ones
// included), the pods started, and the first run after each gap (a resume
// when suspended), p50 and p95.
//
// It runs on envtest with real agents and a real python3 per pod (the test
// kubelet, pods held back -start-delay as a sandbox boot would) and a real
// S3 store (SeaweedFS); no gVisor, so the resume times are the manager's and
// the store's, not a sandbox's (docs/performance.md has those on gVisor).
//
//	go run ./test/suspendbench -sessions 8 -bursts 4 -gap 30s -suspend-after 5s
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

type options struct {
	sessions, bursts, runsPerBurst, replicas int
	gap, suspendAfter, startDelay            time.Duration
	seed                                     int64
}

func main() {
	var o options
	flag.IntVar(&o.sessions, "sessions", 8, "Sessions per pool")
	flag.IntVar(&o.bursts, "bursts", 4, "bursts of runs per Session")
	flag.IntVar(&o.runsPerBurst, "runs", 5, "runs per burst")
	flag.IntVar(&o.replicas, "replicas", 2, "warm pods of each pool")
	flag.DurationVar(&o.gap, "gap", 30*time.Second, "mean idle gap between bursts (exponential)")
	flag.DurationVar(&o.suspendAfter, "suspend-after", 5*time.Second, "sessionSuspendAfter of the suspending pool")
	flag.DurationVar(&o.startDelay, "start-delay", 2*time.Second, "pod start-up delay of the test kubelet")
	flag.Int64Var(&o.seed, "seed", 1, "seed of the gaps")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// sample is what one pool's Sessions did.
type sample struct {
	mu       sync.Mutex
	firstRun []time.Duration // the first run of each burst after the first
	resumed  int
	runTime  time.Duration // time spent in runs
}

func run(o options) error {
	store, err := objectstore.Start()
	if err != nil {
		return err
	}
	defer store.Stop()
	s, err := stack.Start(stack.Options{PodStartDelay: o.startDelay, Configure: func(c *controller.Config) {
		c.Snapshots = &controller.Snapshots{Store: store.Config("suspendbench", "warmpool/")}
	}})
	if err != nil {
		return err
	}
	defer s.Stop()
	ctx := context.Background()
	ns, err := s.Namespace(ctx, "suspend-")
	if err != nil {
		return err
	}
	pools := map[string]*sandboxv1alpha1.SandboxPool{
		"off": wrappers.Pool(ns, "off").Replicas(int32(o.replicas)).SessionIdleTimeout(time.Hour).Obj(),
		"on":  wrappers.Pool(ns, "on").Replicas(int32(o.replicas)).SessionIdleTimeout(time.Hour).SessionSuspendAfter(o.suspendAfter).Obj(),
	}
	for _, p := range pools {
		if err := s.Env.Client.Create(ctx, p); err != nil {
			return err
		}
	}
	kubeconfig, err := s.UserKubeconfig(ctx, ns, "bench", "session-editor-role")
	if err != nil {
		return err
	}
	cfg, err := clientConfig(kubeconfig)
	if err != nil {
		return err
	}
	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	for _, p := range pools {
		if err := waitIdle(ctx, s.Env.Client, p, int32(o.replicas)); err != nil {
			return err
		}
	}

	// The pods of each pool, counted every 250 ms: pod-seconds, and those a
	// Session held while none of its runs was under way.
	acct := newAccounting()
	stop := make(chan struct{})
	go acct.sample(ctx, s.Env.Client, ns, stop)

	samples := map[string]*sample{"off": {}, "on": {}}
	rng := rand.New(rand.NewSource(o.seed))
	// The same gaps for both pools: drawn once.
	gaps := make([][]time.Duration, o.sessions)
	for i := range gaps {
		for range o.bursts {
			gaps[i] = append(gaps[i], time.Duration(rng.ExpFloat64()*float64(o.gap)))
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2*o.sessions)
	for _, pool := range []string{"off", "on"} {
		for i := range o.sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := session(ctx, c, ns, pool, i, o, gaps[i], samples[pool], acct); err != nil {
					errs <- fmt.Errorf("%s session %d: %w", pool, i, err)
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		return err
	default:
	}
	fmt.Printf("%d Sessions per pool, %d bursts of %d runs each, gaps exponential with mean %s, suspendAfter %s, %d warm pods, "+
		"pod start-up delay %s; %s in all\n\n", o.sessions, o.bursts, o.runsPerBurst, o.gap, o.suspendAfter, o.replicas, o.startDelay,
		elapsed.Round(time.Second))
	fmt.Println("| pool | Sessions' idle pod-seconds | all pods' pod-seconds | pods started | first run after a gap p50 | p95 | resumed |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for _, pool := range []string{"off", "on"} {
		sm := samples[pool]
		q := quantiles(sm.firstRun)
		fmt.Printf("| suspend %s | %.0f | %.0f | %d | %s | %s | %d of %d |\n", pool, acct.idleHeld[pool], acct.podSeconds[pool],
			acct.started(pool), q(0.5), q(0.95), sm.resumed, len(sm.firstRun))
	}
	return nil
}

// session runs one Session's bursts.
func session(ctx context.Context, c *sessions.Client, ns, pool string, i int, o options, gaps []time.Duration, sm *sample, acct *accounting) error {
	s, err := c.Create(ctx, ns, fmt.Sprintf("%s-%d-", pool, i), pool, nil)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close(context.Background()) }()
	for b := range o.bursts {
		for r := range o.runsPerBurst {
			acct.running(s.Name, 1)
			start := time.Now()
			res, err := s.Run(ctx, sessions.ExecRequest{Code: "n = globals().get('n', 0) + 1\nn"})
			took := time.Since(start)
			acct.running(s.Name, -1)
			if err != nil {
				return err
			}
			want := fmt.Sprint(b*o.runsPerBurst + r + 1)
			if res.Status != sessions.StatusSucceeded || res.Result == nil || *res.Result != want {
				return fmt.Errorf("run %d of burst %d: %s %v, want %s", r, b, res.Status, res.Result, want)
			}
			sm.mu.Lock()
			sm.runTime += took
			if r == 0 && b > 0 {
				sm.firstRun = append(sm.firstRun, took)
				if res.Resumed {
					sm.resumed++
				}
			}
			sm.mu.Unlock()
		}
		time.Sleep(gaps[b])
	}
	return nil
}

// accounting integrates pods over time, per pool.
type accounting struct {
	mu         sync.Mutex
	runs       map[string]int // Session -> runs under way
	podSeconds map[string]float64
	idleHeld   map[string]float64
	seen       map[string]map[string]bool // pool -> pods ever seen
}

func newAccounting() *accounting {
	return &accounting{runs: map[string]int{}, podSeconds: map[string]float64{}, idleHeld: map[string]float64{},
		seen: map[string]map[string]bool{"off": {}, "on": {}}}
}

func (a *accounting) running(session string, d int) {
	a.mu.Lock()
	a.runs[session] += d
	a.mu.Unlock()
}

func (a *accounting) started(pool string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen[pool])
}

func (a *accounting) sample(ctx context.Context, c client.Client, ns string, stop <-chan struct{}) {
	const every = 250 * time.Millisecond
	for {
		select {
		case <-stop:
			return
		case <-time.After(every):
		}
		var pods corev1.PodList
		if c.List(ctx, &pods, client.InNamespace(ns)) != nil {
			continue
		}
		a.mu.Lock()
		for i := range pods.Items {
			p := &pods.Items[i]
			pool := p.Labels[sandboxpod.LabelPool]
			if _, ok := a.seen[pool]; !ok || sandboxpod.IsTerminal(p) {
				continue
			}
			a.seen[pool][p.Name] = true
			a.podSeconds[pool] += every.Seconds()
			if ses := p.Labels[sandboxpod.LabelSession]; ses != "" && a.runs[ses] == 0 {
				a.idleHeld[pool] += every.Seconds()
			}
		}
		a.mu.Unlock()
	}
}

func quantiles(d []time.Duration) func(float64) string {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return func(p float64) string {
		if len(s) == 0 {
			return "-"
		}
		return s[min(len(s)-1, int(p*float64(len(s))))].Round(100 * time.Microsecond).String()
	}
}

func waitIdle(ctx context.Context, c client.Client, pool *sandboxv1alpha1.SandboxPool, n int32) error {
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got := &sandboxv1alpha1.SandboxPool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), got); err == nil && got.Status.IdleReplicas >= n {
			return nil
		}
	}
	return fmt.Errorf("pool %s not warm after 3 minutes", pool.Name)
}

func clientConfig(kubeconfig string) (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
