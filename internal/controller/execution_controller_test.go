package controller_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/client_golang/prometheus/testutil"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// runLog is a file every run of a test's code appends its name to, so tests
// can count how often each Execution's code really ran.
func runLog() string {
	return filepath.Join(GinkgoT().TempDir(), "runs.log")
}

func logged(name, log string) string {
	return fmt.Sprintf("import os\n_fd = os.open(%q, os.O_WRONLY | os.O_APPEND | os.O_CREAT)\nos.write(_fd, b'%s\\n')\nos.close(_fd)\n", log, name)
}

func runCounts(log string) map[string]int {
	data, _ := os.ReadFile(log)
	counts := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			counts[l]++
		}
	}
	return counts
}

var _ = Describe("Execution", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("succeeds with its stdout and result, and the used pod is replaced", func() {
		succeeded := testutil.ToFloat64(metrics.ExecutionsTotal.WithLabelValues(string(sandboxv1alpha1.PhaseSucceeded), sandboxv1alpha1.ReasonSucceeded))
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		before := poolPods(ns, "python")[0].Name
		ex := run(wrappers.Execution(ns, "hello").Code("print('hello')\nimport sys; print('warn', file=sys.stderr)\n6 * 7").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(ex.Status.Stdout).To(Equal("hello\n"))
		Expect(ex.Status.Stderr).To(Equal("warn\n"))
		Expect(ex.Status.Result).To(Equal("42"))
		Expect(ex.Status.PodName).To(Equal(before))
		Expect(ex.Status.StartTime).NotTo(BeNil())
		Expect(ex.Status.CompletionTime).NotTo(BeNil())
		Expect(ex.Status.DurationMillis).NotTo(BeNil())
		Expect(ex.Status.Duration).NotTo(BeEmpty())
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(HaveField("Reason", sandboxv1alpha1.ReasonSucceeded))
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.ExecutionsTotal.WithLabelValues(string(sandboxv1alpha1.PhaseSucceeded), sandboxv1alpha1.ReasonSucceeded))
		}).Should(BeNumerically(">", succeeded), "warmpool_executions_total counts it")
		// Every pool, autoscaled or not, says how its claims were served and how long its pods take to start.
		Eventually(func(g Gomega) {
			st := getPool(ns, "python").Status
			g.Expect(st.WarmHitRatio).To(Equal("1.000"), "one claim, served by a warm pod")
			// Whole seconds of creation and Ready times: the test kubelet's starts measure "0.0".
			g.Expect(strconv.ParseFloat(st.StartupSeconds, 64)).To(BeNumerically(">=", 0))
		}).Should(Succeed())
		// reusePolicy Never: the pod is gone and a fresh one takes its place.
		Eventually(func() bool {
			pods := poolPods(ns, "python")
			return len(pods) == 1 && pods[0].Name != before && sandboxpod.IsReady(&pods[0])
		}).Should(BeTrue())
	})

	It("keeps its rich results' MIME types and text and the files it wrote, not their content", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		ex := run(wrappers.Execution(ns, "rich").Code(`
class Chart:
    def __repr__(self): return "Chart(3 bars)"
    def _repr_png_(self): return b"PNG" * 1000
    def _repr_html_(self): return "<b>" + "x" * 5000 + "</b>"
display(Chart())
open("out.csv", "w").write("a,b\n1,2\n")
Chart()`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(ex.Status.Results).To(Equal([]sandboxv1alpha1.ExecutionResult{
			{MimeTypes: []string{"image/png", "text/html", "text/plain"}, Text: "Chart(3 bars)"},
			{MimeTypes: []string{"image/png", "text/html", "text/plain"}, Text: "Chart(3 bars)", Main: true},
		}))
		Expect(ex.Status.Files).To(Equal([]sandboxv1alpha1.ExecutionFile{{Path: "out.csv", Size: 8}}))
		Expect(ex.Status.Result).To(Equal("Chart(3 bars)"))
	})

	It("fails with the traceback of the user's code", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := run(wrappers.Execution(ns, "boom").Code("def f():\n    return 1 / 0\n\nf()").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(ex.Status.Error).NotTo(BeNil())
		Expect(ex.Status.Error.Type).To(Equal("ZeroDivisionError"))
		Expect(ex.Status.Error.Traceback).To(ContainSubstring("line 4, in <module>"))
		Expect(ex.Status.Error.Traceback).To(ContainSubstring("line 2, in f"))
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(HaveField("Reason", sandboxv1alpha1.ReasonError))
	})

	It("stops an infinite loop at its timeout with partial output, deletes the pod and refills the pool", func() {
		interrupts := testutil.ToFloat64(metrics.ExecutionInterrupts.WithLabelValues("timeout"))
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		pod := poolPods(ns, "python")[0].Name
		ex := run(wrappers.Execution(ns, "loop").Timeout(time.Second).
			Code("print('working', flush=True)\nwhile True:\n    pass").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseTimedOut))
		Expect(ex.Status.Stdout).To(Equal("working\n"))
		Expect(ex.Status.Error.Type).To(Equal("KeyboardInterrupt"))
		// The agent's clock starts when the run reaches it, a few ms after
		// status.startTime, and it stops the code at startTime + timeout.
		Expect(*ex.Status.DurationMillis).To(BeNumerically("~", 1000, 60))
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.ExecutionInterrupts.WithLabelValues("timeout"))
		}).Should(BeNumerically(">", interrupts), "warmpool_execution_interrupts_total{cause=timeout} counts it")
		Eventually(func() bool {
			pods := poolPods(ns, "python")
			return len(pods) == 1 && pods[0].Name != pod && sandboxpod.IsReady(&pods[0])
		}).Should(BeTrue(), "the timed-out pod is deleted and replaced")
	})

	It("kills code that ignores KeyboardInterrupt after the grace period", func() {
		kills := testutil.ToFloat64(metrics.ExecutionKills.WithLabelValues("interrupt_ignored"))
		createPoolAndWait(wrappers.Pool(ns, "python").GracePeriod(500 * time.Millisecond).Obj())
		pod := poolPods(ns, "python")[0].Name
		ex := run(wrappers.Execution(ns, "stubborn").Timeout(500 * time.Millisecond).Code(`import time
print("stubborn", flush=True)
while True:
    try:
        time.sleep(0.05)
    except KeyboardInterrupt:
        print("ignored", flush=True)`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseTimedOut))
		Expect(ex.Status.Stdout).To(ContainSubstring("stubborn\nignored\n"))
		Expect(ex.Status.Error.Message).To(ContainSubstring("did not stop"))
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Message).To(HavePrefix(
			"the code did not stop at SIGINT at the timeout of 500ms and was killed 500ms later"))
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.ExecutionKills.WithLabelValues("interrupt_ignored"))
		}).Should(BeNumerically(">", kills), "warmpool_execution_kills_total{cause=interrupt_ignored} counts it")
		Eventually(func() []corev1.Pod { return poolPods(ns, "python") }).ShouldNot(ContainElement(HaveField("Name", pod)))
	})

	It("cancels a running Execution", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		// Running is stored a second after the code starts (runningStatusDelay): the marker says it printed.
		marker := filepath.Join(GinkgoT().TempDir(), "started")
		ex := wrappers.Execution(ns, "long").Code(fmt.Sprintf(
			"import time\nprint('started', flush=True)\nopen(%q, 'w').close()\ntime.sleep(60)", marker)).Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() error { _, err := os.Stat(marker); return err }, 30*time.Second).Should(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(ex).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		got := getExec(ex)
		got.Spec.Cancel = true
		Expect(k8s.Update(ctx, got)).To(Succeed())
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseCancelled))
		Expect(done.Status.Stdout).To(Equal("started\n"))
	})

	It("cancels a pending Execution before it runs", func() {
		ex := wrappers.Execution(ns, "never").Pool("no-pool-yet").Cancel().Obj()
		done := run(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseCancelled))
		Expect(done.Status.PodName).To(BeEmpty())
	})

	It("waits with WaitingForSandbox while its pool does not exist, then runs", func() {
		ex := wrappers.Execution(ns, "early").Pool("late").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getExec(ex).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(And(HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonPoolNotFound)))
		Expect(getExec(ex).Status.Phase).To(Equal(sandboxv1alpha1.PhasePending))
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "late").Obj())).To(Succeed())
		Expect(finished(ex).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
	})

	It("runs queued Executions in creation order as pods free up", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Obj())
		log := runLog()
		gate := filepath.Join(GinkgoT().TempDir(), "go")
		// The first holds the only pod until the gate opens, so the others queue up. Names sort
		// against creation order, so only creation time can give the right order;
		// creationTimestamp has one-second resolution, hence the pause between creations.
		names := []string{"q-d", "q-c", "q-b", "q-a"}
		var exs []*sandboxv1alpha1.Execution
		for i, name := range names {
			code := logged(name, log)
			if i == 0 {
				code += fmt.Sprintf("import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.02)\n", gate)
			} else {
				time.Sleep(1100 * time.Millisecond)
			}
			ex := wrappers.Execution(ns, name).Code(code).Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			exs = append(exs, ex)
		}
		Eventually(func() *metaCondition {
			return condition(getExec(exs[3]).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(HaveField("Status", "True"))
		Expect(os.WriteFile(gate, nil, 0o644)).To(Succeed())
		for _, ex := range exs {
			Expect(finished(ex).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		}
		data, err := os.ReadFile(log)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(string(data))).To(Equal(names), "with one pod, the Executions ran in this order")
	})

	It("finishes 50 Executions on a pool of 3, each run exactly once", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(3).Obj())
		log := runLog()
		var exs []*sandboxv1alpha1.Execution
		for i := 0; i < 50; i++ {
			name := fmt.Sprintf("burst-%02d", i)
			ex := wrappers.Execution(ns, name).Code(logged(name, log) + "print('ok')").Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			exs = append(exs, ex)
		}
		pods := map[string]string{}
		for _, ex := range exs {
			done := finished(ex)
			Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", ex.Name, done.Status.Error)
			Expect(done.Status.Stdout).To(Equal("ok\n"))
			Expect(pods).NotTo(HaveKey(done.Status.PodName), "pod %s ran two Executions", done.Status.PodName)
			pods[done.Status.PodName] = ex.Name
		}
		counts := runCounts(log)
		Expect(counts).To(HaveLen(50))
		for name, n := range counts {
			Expect(n).To(Equal(1), "%s ran %d times", name, n)
		}
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(3), "the pool refills")
	})

	It("reuses a pod with a fresh interpreter when the pool opts in", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		first := run(wrappers.Execution(ns, "r-1").Code("secret = 'left behind'").Obj())
		second := run(wrappers.Execution(ns, "r-2").Code("'secret' in globals()").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(second.Status.PodName).To(Equal(first.Status.PodName), "the pod is reused")
		Expect(second.Status.Result).To(Equal("False"), "but its interpreter is fresh")
	})

	It("leaves none of a user's files in /workspace or the temporary directory for a reused pod's next user", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		leave := "import os, tempfile\nopen('secret.txt', 'w').write('alice')\n" +
			"open(os.path.join(tempfile.gettempdir(), 'secret.tmp'), 'w').write('alice')\nos.getcwd()"
		look := "import os, tempfile\nsorted(os.listdir('.')) + sorted(os.listdir(tempfile.gettempdir()))"
		first := run(wrappers.Execution(ns, "f-1").Code(leave).Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", first.Status)
		second := run(wrappers.Execution(ns, "f-2").Code(look).Obj())
		Expect(second.Status.PodName).To(Equal(first.Status.PodName), "the pod is reused")
		Expect(second.Status.Result).To(Equal("[]"), "an Execution's files are gone")

		// A Session's too, once it ends.
		Expect(k8s.Create(ctx, wrappers.Session(ns, "alice").Obj())).To(Succeed())
		sessionIn(ns, "alice", sandboxv1alpha1.SessionReady)
		Expect(run(wrappers.Execution(ns, "s-1").Session("alice").Code(leave).Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(run(wrappers.Execution(ns, "s-2").Session("alice").Code("open('secret.txt').read()").Obj()).Status.Result).
			To(Equal("'alice'"), "a Session keeps its files between its runs")
		Expect(k8s.Create(ctx, wrappers.Session(ns, "bob").Obj())).To(Succeed())
		closeSession(ns, "alice")
		Expect(sessionIn(ns, "bob", sandboxv1alpha1.SessionReady).Status.PodName).To(Equal(first.Status.PodName))
		Expect(run(wrappers.Execution(ns, "b-1").Session("bob").Code(look).Obj()).Status.Result).To(Equal("[]"))
	})

	It("waits with MaxPodsReached while the pool is at its cap", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Obj())
		busy := wrappers.Execution(ns, "holder").Code("import time; time.sleep(3)").Obj()
		Expect(k8s.Create(ctx, busy)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(busy).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		waiting := wrappers.Execution(ns, "waiter").Obj()
		Expect(k8s.Create(ctx, waiting)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getExec(waiting).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(And(HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonMaxPodsReached),
			HaveField("Message", ContainSubstring("maxPods 1"))))
		Expect(finished(waiting).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
	})

	It("fails with SandboxLost when its pod is deleted mid-run", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := wrappers.Execution(ns, "orphan").Code("import time; time.sleep(60)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		// Its claim, not only its Running status: a pod deleted before the claim
		// commits never ran the code, and the Execution claims another.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: waitClaimed(ex)}}
		Expect(k8s.Delete(ctx, pod)).To(Succeed())
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(done.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(HaveField("Reason", sandboxv1alpha1.ReasonSandboxLost))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1))
	})

	It("survives a manager restart mid-run: one run, the right final status", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		log := runLog()
		ex := wrappers.Execution(ns, "across-restart").Code(logged("across-restart", log) +
			"import time\ntime.sleep(2)\nprint('done')\n'result'").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(ex).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		restartManager()
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(done.Status.Stdout).To(Equal("done\n"))
		Expect(done.Status.Result).To(Equal("'result'"))
		Expect(runCounts(log)).To(Equal(map[string]int{"across-restart": 1}))
	})

	It("runs the Executions of a session in order on one pod with shared state, apart from other sessions", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		steps := []string{"x = 1", "x += 10\nx", "x * 2"}
		var exs []*sandboxv1alpha1.Execution
		for i, code := range steps {
			ex := wrappers.Execution(ns, fmt.Sprintf("a-%d", i)).Session("alice").Code(code).Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			exs = append(exs, ex)
		}
		other := run(wrappers.Execution(ns, "b-0").Session("bob").Code("'x' in globals()").Obj())
		results := []string{}
		pods := map[string]bool{}
		for _, ex := range exs {
			done := finished(ex)
			Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", ex.Name, done.Status.Error)
			results = append(results, done.Status.Result)
			pods[done.Status.PodName] = true
		}
		Expect(results).To(Equal([]string{"", "11", "22"}))
		Expect(pods).To(HaveLen(1), "a session runs on one pod")
		Expect(other.Status.Result).To(Equal("False"), "another session must not see alice's state")
		Expect(pods).NotTo(HaveKey(other.Status.PodName))
	})

	It("fails the next Execution of a session whose pod was lost, saying the state is gone", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		first := run(wrappers.Execution(ns, "s-1").Session("notebook").Code("x = 1").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first.Status.PodName}})).To(Succeed())
		second := run(wrappers.Execution(ns, "s-2").Session("notebook").Code("x").Obj())
		Expect(second.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(second.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonSessionLost), HaveField("Message", ContainSubstring("state"))))
	})

	It("deletes a session's pod after the session idle timeout", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").SessionIdleTimeout(time.Second).Obj())
		first := run(wrappers.Execution(ns, "s-1").Session("brief").Code("x = 1").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Eventually(func() []corev1.Pod { return poolPods(ns, "python") }, 10*time.Second).
			ShouldNot(ContainElement(HaveField("Name", first.Status.PodName)))
	})

	It("reads code from a ConfigMap, and fails clearly when it is missing", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scripts",
			Labels: map[string]string{sandboxv1alpha1.LabelCodeSource: "true"}}, Data: map[string]string{"main.py": "print('from cm')"}}
		Expect(k8s.Create(ctx, cm)).To(Succeed())
		ok := run(wrappers.Execution(ns, "cm").NoCode().CodeFromConfigMap("scripts", "main.py").Obj())
		Expect(ok.Status.Stdout).To(Equal("from cm\n"))
		missing := run(wrappers.Execution(ns, "missing").NoCode().CodeFromConfigMap("scripts", "other.py").Obj())
		Expect(missing.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(missing.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonCodeSourceNotFound), HaveField("Message", ContainSubstring(`no key "other.py"`))))
	})

	It("hands context and env to the code, and runs shell", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		py := run(wrappers.Execution(ns, "ctx").JSONContext(`{"items": [1, 2, 3]}`).Env("GREETING", "hi").
			Code("import os\n(sum(context['items']), os.environ['GREETING'])").Obj())
		Expect(py.Status.Result).To(Equal("(6, 'hi')"))
		sh := run(wrappers.Execution(ns, "sh").Language(sandboxv1alpha1.LanguageShell).Code("echo shell; exit 3").Obj())
		Expect(sh.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(sh.Status.Stdout).To(Equal("shell\n"))
		Expect(sh.Status.ExitCode).To(HaveValue(BeEquivalentTo(3)))
	})

	It("deletes a finished Execution after ttlSecondsAfterFinished", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		runUntilDeleted(wrappers.Execution(ns, "ephemeral").TTL(1).Obj())
	})

	It("interrupts the code and frees the pod when a running Execution is deleted", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := wrappers.Execution(ns, "doomed").Code("import time; time.sleep(60)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		pod := waitClaimed(ex)
		Expect(k8s.Delete(ctx, ex)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(ex), ex)) }).Should(BeTrue())
		Eventually(func() []corev1.Pod { return poolPods(ns, "python") }).ShouldNot(ContainElement(HaveField("Name", pod)))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1))
	})

	It("frees the pod of an Execution deleted while the manager was down", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := wrappers.Execution(ns, "deleted-offline").Code("import time; time.sleep(60)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(ex).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		pod := waitClaimed(ex)
		stopManager()
		<-managerDone
		Expect(k8s.Delete(ctx, ex)).To(Succeed())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(ex), ex))).To(BeTrue(), "no finalizer holds the Execution")
		startManager()
		Eventually(func() []corev1.Pod { return poolPods(ns, "python") }).ShouldNot(ContainElement(HaveField("Name", pod)))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1))
	})

	It("runs the samples in config/samples end to end", func() {
		samples := filepath.Join("..", "..", "config", "samples")
		applySamples(ns, samples)
		for _, name := range []string{"hello", "session-step-1", "session-step-2"} {
			ex := &sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			done := finished(ex)
			Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", name, done.Status.Error)
		}
		hello := getExec(&sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hello"}})
		Expect(hello.Status.Stdout).To(HavePrefix("hello from warmpool on Python 3."))
		Expect(hello.Status.Result).To(Equal("45"))
		step2 := getExec(&sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "session-step-2"}})
		Expect(step2.Status.Result).To(Equal("42"))
		sessionIn(ns, "notebook", sandboxv1alpha1.SessionReady)
	})
})
