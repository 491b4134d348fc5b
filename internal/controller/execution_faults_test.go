package controller_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// podGone reports whether the pod is deleted or being deleted.
func podGone(pod *corev1.Pod) bool {
	p := &corev1.Pod{}
	err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), p)
	return apierrors.IsNotFound(err) || (err == nil && (p.UID != pod.UID || p.DeletionTimestamp != nil))
}

// Regression specs of issue 10 (exactly once, whatever fails). Each failed
// on the main branch before the commit point, re-attach and dispatcher.
var _ = Describe("Execution under faults", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	// waitForCrash waits for the manager that crashBefore stopped, and starts a new one.
	restartAfterCrash := func() {
		Eventually(managerDone, 30*time.Second).Should(BeClosed())
		startManager()
	}

	It("keeps a session's result and pod when the manager dies just before the final status", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		crashBeforeFinalStatus("s-1")
		first := wrappers.Execution(ns, "s-1").Session("nb").Code("x = 41\n'set'").Obj()
		Expect(k8s.Create(ctx, first)).To(Succeed())
		restartAfterCrash()
		done := finished(first)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Result).To(Equal("'set'"))
		Expect(done.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionReleaseToSession))
		second := run(wrappers.Execution(ns, "s-2").Session("nb").Code("x + 1").Obj())
		Expect(second.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", second.Status)
		Expect(second.Status.Result).To(Equal("42"), "the session's state survived")
		Expect(second.Status.PodName).To(Equal(done.Status.PodName))
	})

	It("keeps a reused pod for the pool when the manager dies just before the final status", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		crashBeforeFinalStatus("r-1")
		first := wrappers.Execution(ns, "r-1").Code("secret = 1\n'one'").Obj()
		Expect(k8s.Create(ctx, first)).To(Succeed())
		restartAfterCrash()
		done := finished(first)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Result).To(Equal("'one'"))
		second := run(wrappers.Execution(ns, "r-2").Code("'secret' in globals()").Obj())
		Expect(second.Status.PodName).To(Equal(done.Status.PodName), "the pod went back to the pool")
		Expect(second.Status.Result).To(Equal("False"), "with a fresh interpreter")
	})

	It("returns a reset pod to its pool when the API server did not take the release at first", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		// The release after the reset (the pod idle, its claim gone) is
		// refused for 3 s, as by an API server restarting (seen in the e2e
		// chaos spec: the pod stayed claimed by its finished Execution).
		var refused atomic.Int32
		var firstRefusal atomic.Int64
		hook := func(pod *corev1.Pod, _ func()) error {
			if pod.Namespace != ns || lease.ClaimedBy(pod) != "" || pod.Labels[sandboxpod.LabelState] != sandboxpod.StateIdle {
				return nil
			}
			firstRefusal.CompareAndSwap(0, time.Now().UnixNano())
			if time.Since(time.Unix(0, firstRefusal.Load())) < 3*time.Second {
				refused.Add(1)
				return errors.New("injected: dial tcp: i/o timeout")
			}
			return nil
		}
		podUpdateHook.Store(&hook)
		DeferCleanup(func() { podUpdateHook.Store(nil) })
		first := run(wrappers.Execution(ns, "r-1").Code("secret = 1\n'one'").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", first.Status)
		Eventually(refused.Load, 10*time.Second).Should(BeNumerically(">=", 1), "the release was tried and refused")
		second := run(wrappers.Execution(ns, "r-2").Code("'secret' in globals()").Obj())
		Expect(second.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", second.Status)
		Expect(second.Status.PodName).To(Equal(first.Status.PodName), "the pool's only pod went back to it")
		Expect(second.Status.Result).To(Equal("False"), "with a fresh interpreter")
	})

	It("never runs code twice when it reconciles from a stale view of an Execution that already ran", func() {
		// Pods are not reused: the stale claim can only take the replacement,
		// whose agent has never seen the run (a reused pod's would attach to it).
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(2).Obj())
		runLog := filepath.Join(GinkgoT().TempDir(), "runs")
		ex := wrappers.Execution(ns, "once").Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\n'done'", runLog)).Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		asCreated := ex.DeepCopy() // Pending, as a lagging cache would still show it
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1), "a replacement is warm")
		var free corev1.Pod
		for _, p := range poolPods(ns, "python") {
			if p.Name != done.Status.PodName && p.DeletionTimestamp == nil {
				free = p
			}
		}
		Expect(free.Name).NotTo(BeEmpty())

		// A manager whose cache lags: it sees the Execution waiting and the pod idle.
		stopManager()
		<-managerDone
		staleView.Store(asCreated)
		startManager()
		Eventually(func() bool { return staleView.Load() == nil }, 20*time.Second).Should(BeTrue(), "the manager acted on the stale view")
		Consistently(func() string { b, _ := os.ReadFile(runLog); return string(b) }, 3*time.Second).Should(Equal("ran\n"),
			"the code ran once")
		Expect(getExec(ex).Status).To(Equal(done.Status), "the stored result is untouched")
		// An Execution from before the manager led is claimed only after its
		// Running status is stored, which the stale view fails: the free pod
		// was never claimed.
		Expect(lease.ClaimedBy(getPodOf(ns, free.Name))).To(BeEmpty(), "the free pod was not claimed on the stale view")
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1), "a replacement is warm again")
		next := run(wrappers.Execution(ns, "next").Obj())
		Expect(next.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", next.Status)
	})

	It("replaces a pod left claimed by an Execution that ran elsewhere (a claimer that died before handing it back)", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		ex := run(wrappers.Execution(ns, "ran").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		var stray *corev1.Pod
		Eventually(func() *corev1.Pod {
			for _, p := range poolPods(ns, "python") {
				if p.Name != ex.Status.PodName && p.Labels[sandboxpod.LabelState] == sandboxpod.StateIdle && sandboxpod.IsReady(&p) {
					stray = p.DeepCopy()
				}
			}
			return stray
		}).ShouldNot(BeNil())
		Expect(lease.Claim(ctx, k8s, stray, ex)).To(Succeed())
		Eventually(func() bool { return podGone(stray) }).Should(BeTrue(), "the stray claim's pod is replaced")
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
	})

	It("runs code whose Running status was stored but never sent, even when the failover outlasted its timeout", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		f := func(ex *sandboxv1alpha1.Execution) bool {
			return ex.Name == "unsent" && ex.Status.Phase == sandboxv1alpha1.PhaseRunning
		}
		crashAfter.Store(&f)
		ex := wrappers.Execution(ns, "unsent").Timeout(time.Second).Code("print('ran')\n'ok'").Obj()
		createBeforeTheLead(ex)
		Eventually(managerDone, 30*time.Second).Should(BeClosed())
		stored := getExec(ex)
		Expect(stored.Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning))
		time.Sleep(2 * time.Second) // past the timeout
		startManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Stdout).To(Equal("ran\n"))
		Expect(done.Status.StartTime.Time).To(BeTemporally(">", stored.Status.StartTime.Time), "the timeout counts from the real start")
		// Its claim never committed (the manager died before it): the pod its
		// Running status named was held for it meanwhile, and it ran on the
		// next free pod once back in the queue, or on that one.
		Expect(done.Status.PodName).NotTo(BeEmpty())
	})

	It("runs code whose claim was stored but never sent, once, when the manager died between them", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		runLog := filepath.Join(GinkgoT().TempDir(), "runs")
		f := func(pod *corev1.Pod) bool {
			return pod.Namespace == ns && pod.Annotations[sandboxpod.AnnotationClaimedBy] == "claimed-only"
		}
		crashAfterPodUpdate.Store(&f)
		DeferCleanup(func() { crashAfterPodUpdate.Store(nil) })
		ledLongEnough() // claimed alone, with no Running status first
		ex := wrappers.Execution(ns, "claimed-only").Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\n'done'", runLog)).Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(managerDone, 30*time.Second).Should(BeClosed())
		Expect(getExec(ex).Status.Phase).NotTo(Equal(sandboxv1alpha1.PhaseRunning), "no Running status was written before the claim")
		_, err := os.Stat(runLog)
		Expect(os.IsNotExist(err)).To(BeTrue(), "the code was never sent")
		startManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(os.ReadFile(runLog)).To(BeEquivalentTo("ran\n"), "the code ran once, on the pod it claimed")
	})

	It("puts an Execution whose claim lost the race back in the queue and runs it once", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		runLog := filepath.Join(GinkgoT().TempDir(), "runs")
		name := "raced"
		claimLoses.Store(&name)
		ex := run(wrappers.Execution(ns, name).Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\n'done'", runLog)).Obj())
		Expect(claimLoses.Load()).To(BeNil(), "the claim failed once")
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(os.ReadFile(runLog)).To(BeEquivalentTo("ran\n"), "the code ran once")
	})

	It("takes back a Running status stored for a claim that failed, when the manager died before it could", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		runLog := filepath.Join(GinkgoT().TempDir(), "runs")
		name := "raced-crash"
		claimLoses.Store(&name)
		// The claim fails after Running was stored (an Execution from before
		// the manager led stores Running first), and the manager dies as it
		// takes Running back.
		f := func(ex *sandboxv1alpha1.Execution) bool {
			c := condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
			return ex.Name == name && ex.Status.Phase == sandboxv1alpha1.PhasePending && c != nil && strings.Contains(c.Message, "was taken by another")
		}
		crashBefore.Store(&f)
		ex := wrappers.Execution(ns, name).Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\n'done'", runLog)).Obj()
		createBeforeTheLead(ex)
		Eventually(managerDone, 30*time.Second).Should(BeClosed())
		stored := getExec(ex)
		Expect(stored.Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning), "Running was stored")
		pod := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stored.Status.PodName}, pod)).To(Succeed())
		Expect(lease.ClaimedBy(pod)).To(BeEmpty(), "for a pod it never claimed")
		startManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "not SandboxLost: %+v", done.Status)
		Expect(os.ReadFile(runLog)).To(BeEquivalentTo("ran\n"), "the code ran once")
	})

	It("reports the real result after a failover longer than the timeout", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").GracePeriod(time.Second).Obj())
		ex := wrappers.Execution(ns, "long-failover").Timeout(2 * time.Second).
			Code("import time\ntime.sleep(0.5)\nprint('done')\n'ok'").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		// Its Running status may not be stored yet (runningStatusDelay): its claim is.
		Eventually(func() bool { return claimedPodOf(ns, "python", ex) != nil }).Should(BeTrue())
		stopManager()
		<-managerDone
		// Longer than timeout + grace + the runner's slack: a runner started
		// now is already past its deadline.
		time.Sleep(7 * time.Second)
		startManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Stdout).To(Equal("done\n"))
		Expect(done.Status.Result).To(Equal("'ok'"))
	})

	It("finishes a run whose codeFrom was deleted while the manager was away, without reading it again", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job",
			Labels: map[string]string{sandboxv1alpha1.LabelCodeSource: "true"}},
			Data: map[string]string{"main.py": "import time\ntime.sleep(1.5)\n'from the configmap'"}}
		Expect(k8s.Create(ctx, cm)).To(Succeed())
		ex := wrappers.Execution(ns, "cm-gone").NoCode().CodeFromConfigMap("job", "main.py").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(ex).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		Expect(getExec(ex).Status.CodeDigest).To(HavePrefix("sha256:"))
		waitClaimed(ex)
		stopManager()
		<-managerDone
		Expect(k8s.Delete(ctx, cm)).To(Succeed())
		startManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Result).To(Equal("'from the configmap'"))
	})

	It("ends a session's next Execution SessionLost when the interpreter died in between, without running it", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		first := run(wrappers.Execution(ns, "s-1").Session("nb").Code("x = 1").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(first.Status.Interpreter).NotTo(BeEmpty())
		Expect(kubelet.KillInterpreters(ns, first.Status.PodName)).To(BeNumerically(">", 0), "the interpreter of the session's pod")
		second := run(wrappers.Execution(ns, "s-2").Session("nb").Code("x").Obj())
		Expect(second.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", second.Status)
		// SessionLost when the agent had replaced the interpreter already;
		// InterpreterDied when the run found it dead. Never NameError from a fresh one.
		// Or the Session found the new interpreter first and ended Lost, which
		// fails the Execution before it reaches the pod.
		Expect(condition(second.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(Or(
			And(HaveField("Reason", sandboxv1alpha1.ReasonSessionLost), HaveField("Message", ContainSubstring("interpreter"))),
			HaveField("Reason", "InterpreterDied")), "%+v", second.Status)
		if second.Status.PodName != "" {
			Expect(second.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionDelete))
		}
	})

	It("gives the pods that were idle before a manager restart to Executions after it", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Obj())
		for i := 0; i < 3; i++ {
			restartManager()
			// maxPods 1: only the pod from before the restart can run it.
			ex := run(wrappers.Execution(ns, fmt.Sprintf("after-restart-%d", i)).Obj())
			Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		}
	})

	It("refuses an Execution that names a Session of another pool, saying which pool the Session uses", func() {
		createPoolAndWait(wrappers.Pool(ns, "a").Obj())
		createPoolAndWait(wrappers.Pool(ns, "b").Obj())
		inA := run(wrappers.Execution(ns, "a-1").Pool("a").Session("s").Code("x = 'a'").Obj())
		Expect(inA.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		inB := run(wrappers.Execution(ns, "b-1").Pool("b").Session("s").Code("'x' in globals()").Obj())
		Expect(inB.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", inB.Status)
		Expect(inB.Status.PodName).To(BeEmpty(), "it never ran")
		Expect(condition(inB.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonSessionPoolMismatch), HaveField("Message", ContainSubstring("pool a, not b"))))
	})

	It("tells a waiting Execution why its pool cannot start pods", func() {
		none := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}
		quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-pods"}, Spec: corev1.ResourceQuotaSpec{Hard: none}}
		Expect(k8s.Create(ctx, quota)).To(Succeed())
		// The quota controller (absent from envtest) would publish this; admission enforces what it says.
		quota.Status = corev1.ResourceQuotaStatus{Hard: none, Used: none}
		Expect(k8s.Status().Update(ctx, quota)).To(Succeed())
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "python").Obj())).To(Succeed())
		ex := wrappers.Execution(ns, "starved").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getExec(ex).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(And(HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonResourceQuota),
			HaveField("Message", And(ContainSubstring("pool python cannot start pods"), ContainSubstring("exceeded quota")))))
	})

	It("deletes finished Executions after the pool's default TTL", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").ExecutionTTL(1).Obj())
		runUntilDeleted(wrappers.Execution(ns, "short-lived").Obj())
	})
})

var _ = Describe("A pool whose pods cannot start", func() {
	It("reports the import error, tells waiting Executions, and backs off instead of churning pods", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "broken").Preload("no_such_module_xyz").Obj())).To(Succeed())
		ex := wrappers.Execution(ns, "waits").Pool("broken").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "broken").Status.Conditions, sandboxv1alpha1.PoolConditionDegraded)
		}).Should(And(HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonSandboxStartFailed),
			HaveField("Message", ContainSubstring("No module named 'no_such_module_xyz'"))))
		Eventually(func() *metaCondition {
			return condition(getExec(ex).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(And(HaveField("Reason", sandboxv1alpha1.ReasonSandboxStartFailed),
			HaveField("Message", ContainSubstring("No module named 'no_such_module_xyz'"))))
		// Backoff: 1 s, 2 s, 4 s... between attempts, not a pod per reconcile.
		seen := map[string]bool{}
		for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			for _, p := range poolPods(ns, "broken") {
				seen[p.Name] = true
			}
		}
		Expect(len(seen)).To(BeNumerically("<=", 5), "pods started in 6 s: %v", seen)
	})
})

// createBeforeTheLead creates ex while no manager runs, and starts one: an
// Execution from before its manager led, which it claims the careful way
// (its Running status stored first).
func createBeforeTheLead(ex *sandboxv1alpha1.Execution) {
	GinkgoHelper()
	stopManager()
	<-managerDone
	Expect(k8s.Create(ctx, ex)).To(Succeed())
	startManager()
}

// claimedPodOf returns the pod of pool that carries ex's claim, if any.
func claimedPodOf(ns, pool string, ex *sandboxv1alpha1.Execution) *corev1.Pod {
	for _, p := range poolPods(ns, pool) {
		if lease.ClaimedBy(&p) == ex.UID {
			return &p
		}
	}
	return nil
}
