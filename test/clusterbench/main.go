// Command clusterbench measures warmpool on a real cluster (KUBECONFIG) with
// the operator deployed (`make deploy`), as a user sees it: every time is
// taken on this side, from the create call to the watch event that shows the
// result. It prints the numbers docs/performance.md records:
//
//   - Execution create -> Succeeded for print(1) on a warm pool of 5, pods
//     reused (reusePolicy FreshInterpreter) and fresh pods (reusePolicy Never,
//     one Execution at a time once a warm pod is idle);
//
//   - a sandbox pod's creation -> Ready;
//
//   - a burst of Executions on a small pool: time to finish, and time to refill;
//
//   - the baseline: the same print(1) as a Kubernetes Job on the same cluster.
//
//   - with -only dataplane: Sessions side by side with Execution objects in a
//     session (dataplane.go).
//
//     go run ./test/clusterbench -executions 200 -jobs 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

type bench struct {
	c     client.WithWatch
	ns    string
	image string

	mu        sync.Mutex
	exWaiters map[string]chan *sandboxv1alpha1.Execution
	jobDone   map[string]chan time.Time
	podSeen   map[string]time.Time
	podReady  []time.Duration
	seq       int
}

// next numbers Execution names, unique within the run.
// noRefill is -no-refill.
var noRefill *bool

// firstRunDelay is -first-run-delay.
var firstRunDelay time.Duration

func (b *bench) next() int { b.seq++; return b.seq }

// fair is the -only fairness phase's flags.
var fair struct {
	limits                         string
	runs, sessions, clients, bytes int
	pause, warmup                  time.Duration
}

func main() {
	executions := flag.Int("executions", 200, "Executions in the session measurement")
	churn := flag.Int("churn", 40, "Executions per measurement that uses up pods (each costs a pod start)")
	jobs := flag.Int("jobs", 20, "Jobs for the baseline")
	burst := flag.Int("burst", 20, "Executions in the burst")
	image := flag.String("image", "warmpool.dev/repl:dev", "sandbox image")
	runtimeClass := flag.String("runtime-class", "gvisor", "RuntimeClass of the pools and the Jobs")
	only := flag.String("only", "", "run only this phase: podstart, session (quick check of the control-plane path), reuse, dataplane, firstrun (a freshly leased pod's first run, taken apart) seedtable (simple and data-science code on repl-data, warm and cold) or snapshots (snapshot, restore, fork and resume-on-run by namespace size; the controllers need a snapshot store) or fairness (one tenant's runs alone and under another's flood, for each -fair-limits)")
	flag.IntVar(&snapshotRuns, "snapshot-runs", 20, "samples of each snapshot operation and size (-only snapshots)")
	flag.StringVar(&snapshotSizes, "snapshot-sizes", "", "comma-separated names of the states to measure, e.g. '1 KB plain,10 MB numpy' (-only snapshots; default all)")
	flag.StringVar(&seedTable.image, "data-image", "warmpool.dev/repl-data:dev", "the data-science image (-only seedtable)")
	flag.IntVar(&seedTable.runs, "seed-runs", 30, "runs of each code through the data plane (-only seedtable)")
	flag.IntVar(&seedTable.executions, "seed-executions", 10, "Execution objects of each code (-only seedtable)")
	flag.IntVar(&seedTable.cold, "seed-cold", 3, "cold Jobs of each code (-only seedtable)")
	runs := flag.Int("runs", 1000, "print(1) runs per data-plane path (-only dataplane)")
	creates := flag.Int("creates", 30, "Sessions created one at a time for create -> Ready (-only dataplane)")
	noRefill = flag.Bool("no-refill", false, "-only firstrun: cap the pool at its replicas, so that a lease starts no pod beside the run")
	flag.DurationVar(&firstRunDelay, "first-run-delay", 0, "-only firstrun: wait this long after Ready before the first print(1) through the data plane (does the first run wait for something the lease starts?)")
	parallel := flag.Int("parallel", 4, "Sessions running at once for the data plane's throughput (-only dataplane)")
	flag.StringVar(&fair.limits, "fair-limits", "-1/-1,32/-1,32/100,32/20", "comma-separated per-namespace limits of the data plane to measure in turn, each seats/rate (--data-plane-namespace-seats and -rate; -1 for none, 0 for the default) (-only fairness)")
	flag.DurationVar(&fair.warmup, "fair-warmup", 15*time.Second, "how long tenant A floods before tenant B's runs under it are timed: long enough to spend A's saved-up burst (-only fairness)")
	flag.DurationVar(&fair.pause, "fair-pause", 0, "tenant B's pause between its runs, as a caller that reads each answer before the next (-only fairness)")
	flag.IntVar(&fair.runs, "fair-runs", 300, "tenant B's sequential print(1) runs alone and under the flood (-only fairness)")
	flag.IntVar(&fair.sessions, "fair-flood-sessions", 4, "tenant A's Sessions (-only fairness)")
	flag.IntVar(&fair.clients, "fair-flood-clients", 4, "tenant A's runs at once on each of its Sessions (-only fairness)")
	flag.IntVar(&fair.bytes, "fair-flood-bytes", 1, "what each of tenant A's runs prints, in bytes (-only fairness)")
	flag.Parse()
	dataPlane = [3]int{*runs, *creates, *parallel}
	if err := run(*executions, *churn, *jobs, *burst, *image, *runtimeClass, *only); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(1)
	}
}

// dataPlane holds -runs, -creates and -parallel.
var dataPlane [3]int

func run(executions, churn, jobs, burst int, image, runtimeClass string, only string) error {
	cfg, err := config.GetConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	scheme := clientgoscheme.Scheme
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer func() { _ = c.Delete(context.Background(), ns) }()
	b := &bench{c: c, ns: ns.Name, image: image,
		exWaiters: map[string]chan *sandboxv1alpha1.Execution{}, jobDone: map[string]chan time.Time{}, podSeen: map[string]time.Time{}}
	if err := b.watch(ctx); err != nil {
		return err
	}
	fmt.Printf("namespace %s, image %s, runtimeClass %q\n", b.ns, image, runtimeClass)

	if only == "podstart" || only == "" {
		lat, err := b.podStarts(ctx, image, runtimeClass, 10)
		if err != nil {
			return err
		}
		report("one sandbox pod at a time on a quiet node: pod ADDED -> Ready", lat)
		if only == "podstart" {
			return nil
		}
	}

	// Every phase has its pool to itself: on a small node, each idle gVisor
	// sandbox costs a few percent of a core, and each boot much more.
	if only == "firstrun" {
		return b.firstRunPhase(ctx, cfg, image, runtimeClass, dataPlane[1], *noRefill)
	}
	if only == "seedtable" {
		return b.seedTablePhase(ctx, cfg, runtimeClass)
	}
	if only == "snapshots" {
		return b.snapshotPhase(ctx, cfg, image, runtimeClass)
	}
	if only == "fairness" {
		var limits []dataPlaneLimits
		for _, f := range strings.Split(fair.limits, ",") {
			var l dataPlaneLimits
			if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d/%g", &l.seats, &l.rate); err != nil {
				return fmt.Errorf("-fair-limits %q: want seats/rate: %w", f, err)
			}
			limits = append(limits, l)
		}
		return b.fairnessPhase(ctx, cfg, image, runtimeClass, limits)
	}
	if only == "dataplane" {
		return b.dataPlanePhase(ctx, cfg, image, runtimeClass, executions, dataPlane[0], dataPlane[1], dataPlane[2])
	}
	if only == "reuse" {
		return b.reusePhase(ctx, image, runtimeClass, churn)
	}
	fresh := wrappers.Pool(b.ns, "fresh").Image(image).RuntimeClass(runtimeClass).Replicas(5).Obj()
	if err := b.warmPool(ctx, fresh); err != nil {
		return err
	}
	// A session: one pod, its interpreter state kept, no pod churn at all.
	lat, err := b.sequential(ctx, "fresh", executions, nil, "bench-session")
	if err != nil {
		return err
	}
	report(fmt.Sprintf("print(1) in a session (one pod, state kept), %d one at a time", executions), lat)
	if only == "session" {
		return nil
	}
	// The warm path: a fully warm pool and no sandbox booting meanwhile.
	lat, err = b.sequential(ctx, "fresh", churn, func() error { return b.waitIdle(ctx, fresh, 5) }, "")
	if err != nil {
		return err
	}
	report(fmt.Sprintf("print(1), warm pool of 5 (reusePolicy Never), pool full before each, %d one at a time", churn), lat)
	// Back to back: each Execution starts as soon as one pod is idle, while
	// the pool boots replacements for the previous ones.
	lat, err = b.sequential(ctx, "fresh", churn, func() error { return b.waitIdle(ctx, fresh, 1) }, "")
	if err != nil {
		return err
	}
	report(fmt.Sprintf("print(1), pool of 5 (reusePolicy Never), back to back while it refills, %d", churn), lat)
	if err := b.deletePool(ctx, fresh); err != nil {
		return err
	}

	if err := b.reusePhase(ctx, image, runtimeClass, churn); err != nil {
		return err
	}

	// Burst on a pool of 3.
	small := wrappers.Pool(b.ns, "burst").Image(image).RuntimeClass(runtimeClass).Replicas(3).MaxPods(6).Obj()
	if err := b.warmPool(ctx, small); err != nil {
		return err
	}
	if err := b.burst(ctx, small, burst); err != nil {
		return err
	}

	if err := b.deletePool(ctx, small); err != nil {
		return err
	}
	report("sandbox pod creation -> Ready (pods of the session, churn and burst phases: many booting at once)", b.podReadyTimes())

	lat, err = b.jobs(ctx, jobs, runtimeClass)
	if err != nil {
		return err
	}
	report(fmt.Sprintf("baseline: print(1) as a Job (create -> Complete), %d one at a time", jobs), lat)
	return nil
}

// watch follows Executions, Jobs and pods of the namespace and timestamps events on arrival.
func (b *bench) watch(ctx context.Context) error {
	start := func(list client.ObjectList, handle func(watch.Event, time.Time)) error {
		w, err := b.c.Watch(ctx, list, client.InNamespace(b.ns))
		if err != nil {
			return fmt.Errorf("watch %T: %w", list, err)
		}
		go func() {
			for ev := range w.ResultChan() {
				handle(ev, time.Now())
			}
		}()
		return nil
	}
	if err := start(&sandboxv1alpha1.ExecutionList{}, func(ev watch.Event, _ time.Time) {
		ex, ok := ev.Object.(*sandboxv1alpha1.Execution)
		if !ok || !finished(ex.Status.Phase) {
			return
		}
		b.mu.Lock()
		ch := b.exWaiters[ex.Name]
		delete(b.exWaiters, ex.Name)
		b.mu.Unlock()
		if ch != nil {
			ch <- ex
		}
	}); err != nil {
		return err
	}
	if err := start(&batchv1.JobList{}, func(ev watch.Event, at time.Time) {
		job, ok := ev.Object.(*batchv1.Job)
		if !ok {
			return
		}
		for _, cond := range job.Status.Conditions {
			if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
				b.mu.Lock()
				ch := b.jobDone[job.Name]
				delete(b.jobDone, job.Name)
				b.mu.Unlock()
				if ch != nil {
					ch <- at
				}
			}
		}
	}); err != nil {
		return err
	}
	return start(&corev1.PodList{}, func(ev watch.Event, at time.Time) {
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok || pod.Labels[sandboxpod.LabelPool] == "" {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		seen, known := b.podSeen[pod.Name]
		if !known {
			b.podSeen[pod.Name] = at
			seen = at
		}
		if seen.IsZero() {
			return // Ready already counted
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				b.podReady = append(b.podReady, at.Sub(seen))
				b.podSeen[pod.Name] = time.Time{}
			}
		}
	})
}

func finished(p sandboxv1alpha1.ExecutionPhase) bool {
	switch p {
	case sandboxv1alpha1.PhaseSucceeded, sandboxv1alpha1.PhaseFailed, sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.PhaseCancelled:
		return true
	}
	return false
}

func (b *bench) warmPool(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) error {
	if err := b.c.Create(ctx, pool); err != nil {
		return fmt.Errorf("create pool %s: %w", pool.Name, err)
	}
	return b.waitIdle(ctx, pool, pool.Spec.Replicas)
}

// reusePhase runs Executions back to back on a pool that reuses its pods.
func (b *bench) reusePhase(ctx context.Context, image, runtimeClass string, churn int) error {
	reused := wrappers.Pool(b.ns, "reused").Image(image).RuntimeClass(runtimeClass).Replicas(5).
		Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj()
	if err := b.warmPool(ctx, reused); err != nil {
		return err
	}
	lat, err := b.sequential(ctx, "reused", churn, func() error { return b.waitIdle(ctx, reused, 1) }, "")
	if err != nil {
		return err
	}
	report(fmt.Sprintf("print(1), pool of 5 (reusePolicy FreshInterpreter), back to back, %d", churn), lat)
	return b.deletePool(ctx, reused)
}

// deletePool deletes a pool and waits for its pods to be gone.
func (b *bench) deletePool(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) error {
	if err := b.c.Delete(ctx, pool); err != nil {
		return fmt.Errorf("delete pool %s: %w", pool.Name, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		pods := &corev1.PodList{}
		if err := b.c.List(ctx, pods, client.InNamespace(b.ns), client.MatchingLabels{sandboxpod.LabelPool: pool.Name}); err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("pool %s: pods still there 3 minutes after its deletion", pool.Name)
}

func (b *bench) waitIdle(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, n int32) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		got := &sandboxv1alpha1.SandboxPool{}
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(pool), got); err != nil {
			return err
		}
		if got.Status.IdleReplicas >= n {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pool %s: fewer than %d idle pods after 5 minutes", pool.Name, n)
}

// execute creates an Execution and returns the time to its terminal phase.
func (b *bench) execute(ctx context.Context, pool, name, code, session string) (time.Duration, *sandboxv1alpha1.Execution, error) {
	ch := make(chan *sandboxv1alpha1.Execution, 1)
	b.mu.Lock()
	b.exWaiters[name] = ch
	b.mu.Unlock()
	ex := wrappers.Execution(b.ns, name).Pool(pool).Code(code).Session(session).Obj()
	start := time.Now()
	if err := b.c.Create(ctx, ex); err != nil {
		return 0, nil, fmt.Errorf("create execution %s: %w", name, err)
	}
	select {
	case got := <-ch:
		took := time.Since(start)
		if got.Status.Phase != sandboxv1alpha1.PhaseSucceeded {
			return took, got, fmt.Errorf("execution %s ended %s: %+v", name, got.Status.Phase, got.Status.Error)
		}
		return took, got, nil
	case <-time.After(5 * time.Minute):
		return 0, nil, fmt.Errorf("execution %s: no result after 5 minutes", name)
	}
}

func (b *bench) sequential(ctx context.Context, pool string, n int, before func() error, session string) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		if before != nil {
			if err := before(); err != nil {
				return nil, err
			}
		}
		took, _, err := b.execute(ctx, pool, fmt.Sprintf("%s-%05d", pool, b.next()), "print(1)", session)
		if err != nil {
			return nil, err
		}
		out = append(out, took)
	}
	return out, nil
}

func (b *bench) burst(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, n int) error {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	lat := make([]time.Duration, n)
	for i := range n {
		wg.Go(func() {
			took, _, err := b.execute(ctx, pool.Name, fmt.Sprintf("burst-%03d", i), fmt.Sprintf("print(%d)", i), "")
			lat[i] = took
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	drained := time.Since(start)
	refillStart := time.Now()
	if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
		return err
	}
	report(fmt.Sprintf("burst of %d on a pool of %d (maxPods %d), each Execution create -> Succeeded",
		n, pool.Spec.Replicas, *pool.Spec.MaxPods), lat)
	fmt.Printf("  burst: all %d done %v after the first create; pool back to %d idle %v after the last\n",
		n, drained.Round(time.Millisecond), pool.Spec.Replicas, time.Since(refillStart).Round(time.Millisecond))
	return nil
}

func (b *bench) jobs(ctx context.Context, n int, runtimeClass string) ([]time.Duration, error) {
	return b.jobsOf(ctx, n, runtimeClass, b.image, "print(1)")
}

// jobsOf runs code as n Jobs of image, one at a time: create -> Complete.
func (b *bench) jobsOf(ctx context.Context, n int, runtimeClass, image, code string) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		name := fmt.Sprintf("job-%04d", b.next())
		ch := make(chan time.Time, 1)
		b.mu.Lock()
		b.jobDone[name] = ch
		b.mu.Unlock()
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: name},
			Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{
						Name: "python", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
						Command: []string{"/usr/bin/python3", "-c", code},
					}},
				}},
			},
		}
		if runtimeClass != "" {
			job.Spec.Template.Spec.RuntimeClassName = &runtimeClass
		}
		start := time.Now()
		if err := b.c.Create(ctx, job); err != nil {
			return nil, fmt.Errorf("create job: %w", err)
		}
		select {
		case at := <-ch:
			out = append(out, at.Sub(start))
		case <-time.After(3 * time.Minute):
			return nil, fmt.Errorf("job %s: not done after 3 minutes", name)
		}
		_ = b.c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	}
	return out, nil
}

// podStarts creates a pool of one n times (deleting it in between) and returns
// its pod's ADDED -> Ready times: one gVisor sandbox starting with nothing else
// booting beside it.
func (b *bench) podStarts(ctx context.Context, image, runtimeClass string, n int) ([]time.Duration, error) {
	for i := range n {
		pool := wrappers.Pool(b.ns, fmt.Sprintf("single-%02d", i)).Image(image).RuntimeClass(runtimeClass).Obj()
		if err := b.warmPool(ctx, pool); err != nil {
			return nil, err
		}
		if err := b.deletePool(ctx, pool); err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.podReady
	b.podReady = nil
	return out, nil
}

func (b *bench) podReadyTimes() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Duration(nil), b.podReady...)
}

func report(what string, d []time.Duration) {
	if len(d) == 0 {
		fmt.Printf("%s: no samples\n", what)
		return
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	r := func(x time.Duration) string { return x.Round(100 * time.Microsecond).String() }
	fmt.Printf("%s: n=%d p50=%s p90=%s p95=%s p99=%s min=%s max=%s\n", what, len(s), r(q(0.50)), r(q(0.90)), r(q(0.95)), r(q(0.99)), r(s[0]), r(s[len(s)-1]))
}
