package controller_test

import (
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// progressing is the pool's Progressing condition (nil before its first status).
func progressing(ns, name string) *metav1.Condition {
	return meta.FindStatusCondition(getPool(ns, name).Status.Conditions, sandboxv1alpha1.PoolConditionProgressing)
}

func poolEventReasons(ns, name string) []string {
	var evs eventsv1.EventList
	Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range evs.Items {
		if e.Regarding.Kind == "SandboxPool" && e.Regarding.Name == name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

// idleWatch samples a pool's idle Ready pods (not being deleted) from the
// API server until stopped, and keeps the fewest it saw.
type idleWatch struct {
	mu     sync.Mutex
	fewest int
	stop   chan struct{}
	done   chan struct{}
}

func watchIdle(ns, pool string) *idleWatch {
	w := &idleWatch{fewest: 1 << 30, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(w.done)
		for {
			var list corev1.PodList
			if err := k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelPool: pool}); err == nil {
				n := 0
				for i := range list.Items {
					if p := &list.Items[i]; p.DeletionTimestamp == nil && sandboxpod.IsIdle(p) {
						n++
					}
				}
				w.mu.Lock()
				w.fewest = min(w.fewest, n)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *idleWatch) Fewest() int {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fewest
}

// changePool applies change to the pool's spec (again on a conflict with
// the manager's writes) and returns the pool as stored.
func changePool(ns, name string, change func(*sandboxv1alpha1.SandboxPool)) *sandboxv1alpha1.SandboxPool {
	GinkgoHelper()
	var pool *sandboxv1alpha1.SandboxPool
	Eventually(func() error {
		pool = getPool(ns, name)
		change(pool)
		return k8s.Update(ctx, pool)
	}).Should(Succeed())
	return pool
}

var _ = Describe("SandboxPool rollouts", func() {
	It("replaces its warm pods when its template changes without dropping below replicas, and says how far it is", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		Eventually(func() *metav1.Condition { return progressing(ns, "python") }).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", sandboxv1alpha1.ReasonRolloutComplete)))
		// Each Ready pod's agent said which build and protocol it runs.
		Eventually(func() []sandboxv1alpha1.AgentVersionCount { return getPool(ns, "python").Status.Agents }).Should(ConsistOf(And(
			HaveField("Build", HavePrefix("dev")), HaveField("Protocol", BeEquivalentTo(protocol.Version)),
			HaveField("Replicas", BeEquivalentTo(2)), HaveField("Supported", BeTrue()))))
		old := map[string]bool{}
		for _, p := range poolPods(ns, "python") {
			old[p.Name] = true
		}

		idle := watchIdle(ns, "python")
		pool := changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Env = []corev1.EnvVar{{Name: "NEW", Value: "1"}} })
		Eventually(func() []string { return poolEventReasons(ns, "python") }).Should(ContainElement(sandboxv1alpha1.ReasonRollingOut))
		Eventually(func() bool {
			pods := poolPods(ns, "python")
			if len(pods) != 2 {
				return false
			}
			for _, p := range pods {
				if old[p.Name] || !sandboxpod.IsReady(&p) {
					return false
				}
			}
			return true
		}).Should(BeTrue())
		Expect(idle.Fewest()).To(BeNumerically(">=", 2), "the warm count dropped during the rollout")
		Expect(poolPods(ns, "python")[0].Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "NEW", Value: "1"}))
		Eventually(func() *metav1.Condition { return progressing(ns, "python") }).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", sandboxv1alpha1.ReasonRolloutComplete),
			HaveField("ObservedGeneration", pool.Generation)))
		Expect(getPool(ns, "python").Status.UpdatedReplicas).To(BeEquivalentTo(2))
		Eventually(func() []string { return poolEventReasons(ns, "python") }).Should(ContainElement(sandboxv1alpha1.ReasonRolloutComplete))
	})

	It("rolls one pod at a time at maxPods, keeping the warm count, and lets a busy pod finish on its old template", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).MaxPods(3).Obj())
		busy := wrappers.Execution(ns, "long").Code("import time\ntime.sleep(4)\nprint('old', flush=True)").Obj()
		Expect(k8s.Create(ctx, busy)).To(Succeed())
		waitClaimed(busy)
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))

		idle := watchIdle(ns, "python")
		changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Env = []corev1.EnvVar{{Name: "NEW", Value: "1"}} })
		Eventually(func() string { return progressing(ns, "python").Message }).Should(ContainSubstring("1 busy pod(s) finish their work on an older template"))
		Expect(finished(busy).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the busy pod was taken from its run")
		Expect(finished(busy).Status.Stdout).To(Equal("old\n"))
		Eventually(func() *metav1.Condition { return progressing(ns, "python") }).Should(And(
			HaveField("Reason", sandboxv1alpha1.ReasonRolloutComplete), HaveField("Message", Not(ContainSubstring("busy")))))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
		Expect(idle.Fewest()).To(BeNumerically(">=", 1), "at maxPods one old pod at a time makes room")
		for _, p := range poolPods(ns, "python") {
			Expect(p.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "NEW", Value: "1"}))
		}
	})

	It("stops a rollout whose new pods fail to start, the old pods serving, and completes it when rolled back", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).MaxPods(3).Obj())
		old := map[string]bool{}
		for _, p := range poolPods(ns, "python") {
			old[p.Name] = true
		}
		changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Python.Preload = []string{"no_such_module_xyz"} })
		Eventually(func() *metav1.Condition { return progressing(ns, "python") }, time.Minute).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", sandboxv1alpha1.ReasonRolloutStalled),
			HaveField("Message", And(ContainSubstring("2 old pod(s) keep serving"), ContainSubstring("no_such_module_xyz")))))
		Eventually(func() []string { return poolEventReasons(ns, "python") }).Should(ContainElement(sandboxv1alpha1.ReasonRolloutStalled))
		// The old pods stay and serve: no room is made for pods that do not start.
		Consistently(func() int {
			n := 0
			for _, p := range poolPods(ns, "python") {
				if old[p.Name] && sandboxpod.IsIdle(&p) {
					n++
				}
			}
			return n
		}, 3*time.Second).Should(Equal(2))
		Expect(getPool(ns, "python").Status.UpdatedReplicas).To(BeEquivalentTo(0))
		ex := run(wrappers.Execution(ns, "still-served").Code("print(6*7)").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(old[ex.Status.PodName]).To(BeTrue(), "served by an old pod")

		// Rolled back: the old template is current again, and its pods with it.
		changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Python.Preload = nil })
		Eventually(func() *metav1.Condition { return progressing(ns, "python") }, time.Minute).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", sandboxv1alpha1.ReasonRolloutComplete)))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
	})
})
