//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// The previous release (Makefile: PREVIOUS_RELEASE, built by make
// previous-images): its chart, its manager's image, and its agent in the
// sandbox image. The Helm specs install it, then upgrade to this build under
// load (docs/upgrades.md).
var (
	previousChart        = envOr("E2E_PREVIOUS_CHART", repoRoot()+"/dist/previous-chart")
	previousManagerImage = envOr("E2E_PREVIOUS_MANAGER_IMAGE", "warmpool.dev/manager:previous")
	previousImage        = envOr("E2E_PREVIOUS_REPL_IMAGE", "warmpool.dev/repl:previous")
	previousBuild        = envOr("E2E_PREVIOUS_VERSION", "v0.1.0")
)

// upgradeLoad is what runs while the manager is upgraded: a mixed stream of
// Executions (every kind, on pools of the previous release's agents) and
// Sessions that stream counting steps through the data plane, one of them
// with steps longer than a data-plane replica's drain, so that its stream is
// cut by a replica's exit and picked up again by run ID.
type upgradeLoad struct {
	ns          string
	plain, py   *sandboxv1alpha1.SandboxPool
	cases       map[string]chaosCase
	stop        chan struct{}
	wg          sync.WaitGroup
	mu          sync.Mutex
	problems    []string
	steps       map[string]int
	sessionPods map[string]string
}

func (l *upgradeLoad) problem(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

func startUpgradeLoad() *upgradeLoad {
	GinkgoHelper()
	l := &upgradeLoad{ns: newNamespace(), cases: map[string]chaosCase{}, stop: make(chan struct{}),
		steps: map[string]int{}, sessionPods: map[string]string{}}
	previous := func(p *wrappers.PoolWrapper) *sandboxv1alpha1.SandboxPool {
		pool := p.Image(previousImage).Obj()
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		waitWarm(pool)
		return pool
	}
	l.plain = previous(wrappers.Pool(l.ns, "plain").Replicas(3).GracePeriod(time.Second))
	fresh := previous(wrappers.Pool(l.ns, "fresh").Replicas(2).Reuse(sandboxv1alpha1.ReuseFreshInterpreter))
	l.py = previous(wrappers.Pool(l.ns, "py").Replicas(2).Timeout(time.Minute))
	waitAPIServiceAvailable()
	c, err := sessions.New(restConfig)
	Expect(err).NotTo(HaveOccurred())

	By("streaming counting steps in two Sessions through the data plane")
	for _, sc := range []struct {
		name  string
		sleep string
	}{{"short", "0.5"}, {"long", "25"}} {
		s, err := c.Create(ctx, l.ns, sc.name, l.py.Name, nil)
		Expect(err).NotTo(HaveOccurred())
		obj, err := s.WaitReady(ctx)
		Expect(err).NotTo(HaveOccurred())
		l.sessionPods[sc.name] = obj.Status.PodName
		l.wg.Add(1)
		go func(name, sleep string) {
			defer GinkgoRecover()
			defer l.wg.Done()
			for step := 1; ; step++ {
				select {
				case <-l.stop:
					return
				default:
				}
				code := fmt.Sprintf("import time\nn = globals().get('n', 0) + 1\nprint('step', n, flush=True)\ntime.sleep(%s)\nn", sleep)
				var out string
				rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
				res, err := s.RunStream(rctx, sessions.ExecRequest{Code: code}, sessions.Handlers{OnStdout: func(d string) { out += d }})
				cancel()
				switch {
				case err != nil:
					l.problem("Session %s step %d: %v", name, step, err)
					return
				case res.Status != sessions.StatusSucceeded || res.Result == nil || *res.Result != fmt.Sprint(step):
					l.problem("Session %s step %d: %s, result %v (a step lost or run twice)", name, step, res.Status, res.Result)
					return
				case out != fmt.Sprintf("step %d\n", step):
					l.problem("Session %s step %d streamed %q", name, step, out)
				}
				l.mu.Lock()
				l.steps[name] = step
				l.mu.Unlock()
			}
		}(sc.name, sc.sleep)
	}

	By("creating Executions of every kind, one a second or so")
	rng := rand.New(rand.NewSource(1))
	l.wg.Add(1)
	go func() {
		defer GinkgoRecover()
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-time.After(time.Duration(700+rng.Intn(600)) * time.Millisecond):
			}
			if l.saturated() {
				continue
			}
			c, w := mixedExecution(rng, l.ns, i, l.plain, fresh)
			ex := w.Obj()
			createThroughFaults(ex)
			l.mu.Lock()
			l.cases[ex.Name] = c
			l.mu.Unlock()
			if c.kind == chaosCancel {
				go func(ex *sandboxv1alpha1.Execution) {
					defer GinkgoRecover()
					time.Sleep(time.Second)
					patchThroughFaults(ex, `{"spec":{"cancel":true}}`)
				}(ex)
			}
		}
	}()
	// Some of it under way before the upgrade begins.
	Eventually(func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.steps["short"] >= 3 && len(l.cases) >= 5
	}).WithTimeout(2*time.Minute).Should(BeTrue(), "the load runs")
	return l
}

// The load's bounds: an open loop of about one Execution a second, a third of
// which end by deleting their pod, once left 80 gVisor pods starting and
// stopping at a load average of 147 on a 2-core kind node, with the data
// plane's rollout stuck behind them for over 6 minutes. The load waits
// instead while the machine has this much in hand.
const (
	upgradeLoadMaxPods       = 16
	upgradeLoadMaxUnfinished = 6
)

// saturated reports whether the load's namespace holds as many pods (live
// or terminating) or unfinished Executions as the load allows.
func (l *upgradeLoad) saturated() bool {
	pods := &corev1.PodList{}
	exs := &sandboxv1alpha1.ExecutionList{}
	if k8s.List(ctx, pods, client.InNamespace(l.ns)) != nil || k8s.List(ctx, exs, client.InNamespace(l.ns)) != nil {
		return true // the API server is away (the upgrade restarts things): wait, as when busy
	}
	unfinished := 0
	for _, ex := range exs.Items {
		if !ex.Status.Phase.IsFinished() {
			unfinished++
		}
	}
	return len(pods.Items) >= upgradeLoadMaxPods || unfinished >= upgradeLoadMaxUnfinished
}

// stopAndCheck stops the load after one more rolling restart of the data
// plane (this build's drain, under the same load), waits for every
// Execution, and checks each ended as its code says, once, and that every
// Session kept its pod.
func (l *upgradeLoad) stopAndCheck() {
	GinkgoHelper()
	By("restarting this build's data plane under the same load (its drain)")
	run(kubectl(), "-n", "warmpool-system", "rollout", "restart", "deployment/warmpool-data-plane")
	// Its old pods drain their streams (the long Session's 25 s step) before they go: on a
	// loaded 2-core node, with gVisor pods starting for the load, that has taken over 3 min.
	run(kubectl(), "-n", "warmpool-system", "rollout", "status", "deployment/warmpool-data-plane", "--timeout=6m")
	time.Sleep(5 * time.Second)
	close(l.stop)
	l.wg.Wait()

	By("waiting for every Execution to end")
	var all []sandboxv1alpha1.Execution
	Eventually(func(g Gomega) {
		list := &sandboxv1alpha1.ExecutionList{}
		g.Expect(k8s.List(ctx, list, client.InNamespace(l.ns))).To(Succeed())
		all = list.Items
		for _, ex := range all {
			g.Expect(ex.Status.Phase.IsFinished()).To(BeTrue(), "%s is %s: %+v", ex.Name, ex.Status.Phase, ex.Status.Conditions)
		}
	}).WithTimeout(5 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	r := checkChaos(all, l.cases)
	problems := append([]string{}, r.problems...)
	for _, ex := range all {
		c, ok := l.cases[ex.Name]
		if !ok {
			continue
		}
		reason := ""
		if cond := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete); cond != nil {
			reason = cond.Reason
		}
		if got := string(ex.Status.Phase) + "/" + reason; got != exactOutcome[c.kind] {
			problems = append(problems, fmt.Sprintf("%s (%s) ended %s, want %s: %+v", ex.Name, c.kind, got, exactOutcome[c.kind], ex.Status.Error))
		}
	}
	l.mu.Lock()
	problems = append(problems, l.problems...)
	steps := fmt.Sprint(l.steps)
	l.mu.Unlock()
	for name, pod := range l.sessionPods {
		ses := &sandboxv1alpha1.Session{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: l.ns, Name: name}, ses)).To(Succeed())
		if ses.Status.Phase != sandboxv1alpha1.SessionReady || ses.Status.PodName != pod {
			problems = append(problems, fmt.Sprintf("Session %s is %s on pod %q, was Ready on %q", name, ses.Status.Phase, ses.Status.PodName, pod))
		}
	}
	report := fmt.Sprintf("%d Executions through the upgrade; outcomes %v; Session steps %s; double runs %d, wrong results %d",
		len(all), r.outcomes, steps, r.double, r.wrong)
	AddReportEntry("upgrade", report)
	fmt.Fprintln(GinkgoWriter, report)
	Expect(problems).To(BeEmpty(), report)
	Expect(len(all)).To(BeNumerically(">=", 20), "too little load to mean anything: %s", report)
	l.mu.Lock()
	Expect(l.steps["long"]).To(BeNumerically(">=", 2), "the long Session's steps: %s", steps)
	l.mu.Unlock()
}

// rollPreviousAgents checks that the load's pools of the previous release's
// agents still serve under this manager, which says which agents they run,
// then rolls one to this release's image: its warm count holds throughout,
// and the rollout completes.
func (l *upgradeLoad) rollPreviousAgents() {
	GinkgoHelper()
	pool := l.plain
	key := client.ObjectKeyFromObject(pool)
	get := func(g Gomega) *sandboxv1alpha1.SandboxPool {
		got := &sandboxv1alpha1.SandboxPool{}
		g.Expect(k8s.Get(ctx, key, got)).To(Succeed())
		return got
	}
	waitWarm(pool)
	Eventually(func(g Gomega) []sandboxv1alpha1.AgentVersionCount { return get(g).Status.Agents }).WithTimeout(time.Minute).Should(
		ContainElement(And(HaveField("Build", previousBuild), HaveField("Protocol", BeEquivalentTo(1)), HaveField("Supported", BeTrue()))))
	ex := execute(wrappers.Execution(l.ns, "on-previous").Pool(pool.Name).Code("print(2)\n6 * 7").Obj())
	Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
	Expect(ex.Status.Result).To(Equal("42"))
	waitWarm(pool)

	By("rolling the pool to this release's image")
	var fewest = int32(1 << 30)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		for {
			var list corev1.PodList
			if err := k8s.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{sandboxpod.LabelPool: pool.Name}); err == nil {
				var n int32
				for i := range list.Items {
					if p := &list.Items[i]; p.DeletionTimestamp == nil && sandboxpod.IsIdle(p) {
						n++
					}
				}
				fewest = min(fewest, n)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	Eventually(func() error {
		p := &sandboxv1alpha1.SandboxPool{}
		if err := k8s.Get(ctx, key, p); err != nil {
			return err
		}
		p.Spec.Image = image
		return k8s.Update(ctx, p)
	}).Should(Succeed())
	Eventually(func(g Gomega) {
		got := get(g)
		c := meta.FindStatusCondition(got.Status.Conditions, sandboxv1alpha1.PoolConditionProgressing)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(sandboxv1alpha1.ReasonRolloutComplete), c.Message)
		g.Expect(c.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.UpdatedReplicas).To(Equal(got.Spec.Replicas))
		// Its warm pods are new; the pods of the load's sessions finish on the old one.
		for _, p := range poolPods(g, pool) {
			if p.DeletionTimestamp == nil && sandboxpod.IsIdle(&p) {
				g.Expect(p.Spec.Containers[0].Image).To(Equal(image), "pod %s", p.Name)
			}
		}
		g.Expect(got.Status.Agents).To(ContainElement(And(HaveField("Build", Not(Equal(previousBuild))),
			HaveField("Replicas", BeNumerically(">=", got.Spec.Replicas)), HaveField("Supported", BeTrue()))))
	}).WithTimeout(4 * time.Minute).Should(Succeed())
	close(stop)
	<-done
	Expect(fewest).To(BeNumerically(">=", pool.Spec.Replicas), "the warm count dropped during the rollout")
	ex = execute(wrappers.Execution(l.ns, "on-current").Pool(pool.Name).Code("6 * 7").Obj())
	Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
}
