//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Pools across nodes, drains and a node that stops answering, on a cluster
// with a control-plane node and two gVisor workers (make test-e2e-nodes:
// hack/kind.sh with KIND_WORKERS=2, which also says how to stop a node).
// The manager, its data plane and the snapshot store run on the control-plane
// node, as a platform keeps its system pods off the sandbox nodes: a drained
// or lost worker takes sandboxes with it, never the manager.
var _ = Describe("Across nodes", Ordered, Label("nodes"), func() {
	var workers []string
	var c *sessions.Client

	BeforeAll(func() {
		want := clusterWorkers()
		if want < 2 {
			Skip("needs a cluster with two gVisor workers and a way to stop one (make test-e2e-nodes)")
		}
		nodes := &corev1.NodeList{}
		Expect(k8s.List(ctx, nodes)).To(Succeed())
		for _, n := range nodes.Items {
			if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
				workers = append(workers, n.Name)
			}
		}
		Expect(workers).To(HaveLen(want), "the cluster's workers")
		// The manager is on the control-plane node (BeforeSuite); so goes
		// the snapshot store.
		useSnapshotStore()
		pinToControlPlane("warmpool-s3", "deployment/seaweedfs")
		var err error
		c, err = sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
	})

	It("spread a pool's warm pods over the workers, and kubectl warmpool top -o wide shows it", func() {
		ns := newNamespace()
		pool := warmPool(wrappers.Pool(ns, "py").Replicas(4))
		Eventually(func(g Gomega) {
			g.Expect(podsPerNode(g, pool, true)).To(Equal(map[string]int{workers[0]: 2, workers[1]: 2}))
		}).WithTimeout(time.Minute).Should(Succeed())

		bin := GinkgoT().TempDir()
		run("go", "build", "-o", filepath.Join(bin, "kubectl-warmpool"), filepath.Join(repoRoot(), "cmd", "kubectl-warmpool"))
		cmd := exec.Command(kubectl(), "warmpool", "top", "-o", "wide", "-n", ns)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(string(out)).To(ContainSubstring("NODES"))
		Expect(string(out)).To(Or(ContainSubstring(workers[0]+"=2,"+workers[1]+"=2"), ContainSubstring(workers[1]+"=2,"+workers[0]+"=2")))
	})

	It("drain a worker: its running Execution finishes, its Sessions move to the other worker with their state, and the drain ends soon after the step", func() {
		ns := newNamespace()
		pool := warmPool(requiredSpread(wrappers.Pool(ns, "py").Replicas(4)))
		from, to := workers[0], workers[1]

		// Everything on one worker: the other is cordoned while the work is
		// placed, then opened again with warm pods of its own to move to.
		onlyOn(pool, from, to)
		var movers []*sessions.Session
		for i := range 2 {
			s, err := c.Create(ctx, ns, "mover-", "py", nil)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _ = s.Close(ctx) })
			res, err := s.Run(ctx, sessions.ExecRequest{Code: fmt.Sprintf("x = %d\nopen('kept.txt', 'w').write('file %d')", 40+i, i)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
			movers = append(movers, s)
		}
		// A step long enough to be still running after the other worker has
		// warm pods again (a gVisor pod start or two on this loaded machine).
		step := wrappers.Execution(ns, "step").Pool("py").Timeout(3 * time.Minute).
			Code("import time\ntime.sleep(45)\nprint('step done')").Obj()
		Expect(k8s.Create(ctx, step)).To(Succeed())
		waitRunning(step)
		Expect(nodeOfExecution(step)).To(Equal(from))
		for _, s := range movers {
			Expect(nodeOfSession(s)).To(Equal(from))
		}
		openWithWarmPods(pool, to, 2)

		By("draining " + from)
		drain := exec.Command(kubectl(), "drain", from, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
		var drainOut bytes.Buffer
		drain.Stdout, drain.Stderr = &drainOut, &drainOut
		began := time.Now()
		Expect(drain.Start()).To(Succeed())
		DeferCleanup(func() { run(kubectl(), "uncordon", from) })
		drainErr := make(chan error, 1)
		go func() { drainErr <- drain.Wait() }()

		done := finished(step, 3*time.Minute)
		stepEnd := time.Now()
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the drain waits for the running step: %+v", done.Status)
		Expect(done.Status.Stdout).To(Equal("step done\n"))
		Expect(done.Status.CompletionTime.Time).To(BeTemporally(">", began.Truncate(time.Second)), "the step ended before the drain began")
		Eventually(drainErr).WithTimeout(3*time.Minute).Should(Receive(BeNil()), func() string { return drainOut.String() })
		drained := time.Since(began)
		afterStep := time.Since(stepEnd)

		for i, s := range movers {
			ses, err := s.Get(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
			Expect(ses.Status.LastMove).NotTo(BeNil(), "Session %s did not move", ses.Name)
			Expect(ses.Status.LastMove.FromNode).To(Equal(from))
			Expect(ses.Status.LastMove.ToNode).To(Equal(to))
			Expect(nodeOfSession(s)).To(Equal(to))
			GinkgoWriter.Printf("Session %s moved %s -> %s, paused %d ms\n", ses.Name, from, to, ses.Status.LastMove.PauseMillis)
			res, err := s.Run(ctx, sessions.ExecRequest{Code: "(x, open('kept.txt').read())"})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
			Expect(*res.Result).To(Equal(fmt.Sprintf("(%d, 'file %d')", 40+i, i)))
			Expect(res.Moved).NotTo(BeNil(), "the first run after the move does not say it moved")
			Expect(res.Moved.FromNode).To(Equal(from))
		}
		GinkgoWriter.Printf("drain of %s: %s from its start to its end, %s after the running step's end was seen (%s after the drain began)\n",
			from, drained.Round(time.Millisecond), afterStep.Round(time.Millisecond), stepEnd.Sub(began).Round(time.Millisecond))
		// The drain waits for the step, then a few seconds, not for the Sessions to end (they are still open).
		Expect(afterStep).To(BeNumerically("<", 30*time.Second))
	})

	It("lose a worker that stops answering: its running Execution ends SandboxLost, a plain Session Lost, both naming the node; a durable Session resumes on the other worker", func() {
		ns := newNamespace()
		pool := warmPool(requiredSpread(wrappers.Pool(ns, "py").Replicas(4)))
		lost, other := workers[1], workers[0]

		onlyOn(pool, lost, other)
		long := wrappers.Execution(ns, "long").Pool("py").Timeout(10 * time.Minute).
			Code("import time\nprint('started', flush=True)\ntime.sleep(300)\nprint('ended')").Obj()
		Expect(k8s.Create(ctx, long)).To(Succeed())
		waitRunning(long)
		durable, err := c.Create(ctx, ns, "durable-", "py", &sessions.Options{Checkpoint: ptrDuration(0)})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = durable.Close(ctx) })
		plain, err := c.Create(ctx, ns, "plain-", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = plain.Close(ctx) })
		for _, s := range []*sessions.Session{durable, plain} {
			res, err := s.Run(ctx, sessions.ExecRequest{Code: "x = 41"})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		}
		Eventually(func(g Gomega) {
			ses, err := durable.Get(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ses.Status.Checkpoint).NotTo(BeNil())
			g.Expect(ses.Status.Checkpoint.Run).To(BeEquivalentTo(1))
		}).WithTimeout(time.Minute).Should(Succeed())
		Expect(nodeOfExecution(long)).To(Equal(lost))
		Expect(nodeOfSession(durable)).To(Equal(lost))
		Expect(nodeOfSession(plain)).To(Equal(lost))
		openWithWarmPods(pool, other, 2)

		By("stopping " + lost)
		stop, start := strings.Fields(os.Getenv("E2E_NODE_STOP")), strings.Fields(os.Getenv("E2E_NODE_START"))
		Expect(stop).NotTo(BeEmpty(), "E2E_NODE_STOP says how to stop a node")
		run(stop[0], append(stop[1:], lost)...)
		stopped := time.Now()
		DeferCleanup(func() {
			run(start[0], append(start[1:], lost)...)
			run(kubectl(), "wait", "--for=condition=Ready", "node/"+lost, "--timeout=3m")
		})

		var toExecution, toPlain, toDurable time.Duration
		Eventually(func(g Gomega) {
			if toExecution == 0 {
				ex := &sandboxv1alpha1.Execution{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(long), ex)).To(Succeed())
				if ex.Status.Phase == sandboxv1alpha1.PhaseFailed {
					toExecution = time.Since(stopped)
				}
			}
			if toPlain == 0 {
				ses, err := plain.Get(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				if ses.Status.Phase == sandboxv1alpha1.SessionLost {
					toPlain = time.Since(stopped)
				}
			}
			if toDurable == 0 {
				ses, err := durable.Get(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				if ses.Status.Phase == sandboxv1alpha1.SessionReady && ses.Status.LastMove != nil && ses.Status.LastMove.Checkpoint != nil {
					toDurable = time.Since(stopped)
				}
			}
			g.Expect([]time.Duration{toExecution, toPlain, toDurable}).NotTo(ContainElement(BeZero()))
		}).WithTimeout(4 * time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("%s stopped -> final word seen: running Execution %s, plain Session %s, durable Session Ready again %s\n",
			lost, toExecution.Round(time.Millisecond), toPlain.Round(time.Millisecond), toDurable.Round(time.Millisecond))

		ex := &sandboxv1alpha1.Execution{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(long), ex)).To(Succeed())
		complete := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
		Expect(complete).NotTo(BeNil())
		Expect(complete.Reason).To(Equal(sandboxv1alpha1.ReasonSandboxLost))
		Expect(ex.Status.Error.Message).To(ContainSubstring(fmt.Sprintf("node %s stopped answering", lost)))
		Expect(ex.Status.Error.Message).To(ContainSubstring("not run again"))

		ses, err := plain.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		ready := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady)
		Expect(ready).NotTo(BeNil())
		Expect(ready.Reason).To(Equal(sandboxv1alpha1.ReasonNodeLost))
		Expect(ready.Message).To(ContainSubstring(fmt.Sprintf("node %s stopped answering", lost)))

		ses, err = durable.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(ses.Status.LastMove.FromNode).To(Equal(lost))
		Expect(nodeOfSession(durable)).To(Equal(other))
		res, err := durable.Run(ctx, sessions.ExecRequest{Code: "x + 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("42"))
		Expect(res.Moved).NotTo(BeNil(), "the first run after the recovery does not say it")
		Expect(res.Moved.Run).To(BeEquivalentTo(1))

		By("starting " + lost + " again: what ran there is not run again")
		run(start[0], append(start[1:], lost)...)
		run(kubectl(), "wait", "--for=condition=Ready", "node/"+lost, "--timeout=3m")
		Consistently(func(g Gomega) {
			ex := &sandboxv1alpha1.Execution{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(long), ex)).To(Succeed())
			g.Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
			g.Expect(ex.Status.Stdout).NotTo(ContainSubstring("ended"))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			for _, p := range poolPods(g, pool) {
				g.Expect(p.Spec.NodeName == lost && p.Labels[sandboxpod.LabelState] == sandboxpod.StateBusy).To(BeFalse(),
					"pod %s on %s is still busy after its node came back", p.Name, lost)
			}
		}).WithTimeout(2 * time.Minute).Should(Succeed())
	})
})

// requiredSpread holds the pool's skew over nodes at 1 (spec.nodeSpread
// Required): where the specs put new warm pods is then the scheduler's rule,
// not its preference (a Preferred spread once left one of two new pods on
// the busier node).
func requiredSpread(p *wrappers.PoolWrapper) *wrappers.PoolWrapper {
	p.Spec.NodeSpread = sandboxv1alpha1.NodeSpreadRequired
	return p
}

// podsPerNode counts the pool's live pods (only the Ready ones when ready) per node.
func podsPerNode(g Gomega, pool *sandboxv1alpha1.SandboxPool, ready bool) map[string]int {
	per := map[string]int{}
	for _, p := range poolPods(g, pool) {
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || ready && !readyPod(&p) {
			continue
		}
		per[p.Spec.NodeName]++
	}
	return per
}

// idleOn counts the pool's idle Ready pods on node.
func idleOn(g Gomega, pool *sandboxv1alpha1.SandboxPool, node string) int {
	n := 0
	for _, p := range poolPods(g, pool) {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == node && readyPod(&p) && p.Labels[sandboxpod.LabelState] == sandboxpod.StateIdle {
			n++
		}
	}
	return n
}

// onlyOn cordons other until the pool's warm pods are all on node, so that
// what the spec places next lands there; openWithWarmPods opens it again.
func onlyOn(pool *sandboxv1alpha1.SandboxPool, node, other string) {
	GinkgoHelper()
	run(kubectl(), "cordon", other)
	DeferCleanup(func() { run(kubectl(), "uncordon", other) })
	Eventually(func(g Gomega) {
		per := podsPerNode(g, pool, false)
		g.Expect(per).NotTo(HaveKey(other))
		g.Expect(idleOn(g, pool, node)).To(BeNumerically(">=", pool.Spec.Replicas))
	}).WithTimeout(3 * time.Minute).Should(Succeed())
}

// openWithWarmPods uncordons node and raises the pool until n of its warm
// pods are Ready there (its required spread puts the new ones on it).
func openWithWarmPods(pool *sandboxv1alpha1.SandboxPool, node string, n int) {
	GinkgoHelper()
	run(kubectl(), "uncordon", node)
	Eventually(func() error {
		got := &sandboxv1alpha1.SandboxPool{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pool), got); err != nil {
			return err
		}
		got.Spec.Replicas += int32(n)
		return k8s.Update(ctx, got)
	}).Should(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(idleOn(g, pool, node)).To(BeNumerically(">=", n))
	}).WithTimeout(3 * time.Minute).Should(Succeed())
}

func nodeOfPod(ns, name string) string {
	GinkgoHelper()
	p := &corev1.Pod{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	return p.Spec.NodeName
}

func nodeOfExecution(ex *sandboxv1alpha1.Execution) string {
	GinkgoHelper()
	got := &sandboxv1alpha1.Execution{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
	Expect(got.Status.PodName).NotTo(BeEmpty())
	return nodeOfPod(ex.Namespace, got.Status.PodName)
}

func nodeOfSession(s *sessions.Session) string {
	GinkgoHelper()
	ses, err := s.Get(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(ses.Status.PodName).NotTo(BeEmpty())
	return nodeOfPod(ses.Namespace, ses.Status.PodName)
}
