//go:build e2e

package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The bad-input catalogue, resource side: code that eats memory, forks,
// starts threads without end, fills its disk or burns every core ends with a status that
// names what happened, with the output it printed, on gVisor with the pool's
// default limits (512Mi, 1 CPU, spec.limits defaults). None of them ends
// SandboxLost.
var _ = Describe("hostile code against the sandbox's limits", Ordered, ContinueOnFailure, func() {
	var ns string

	BeforeAll(func() {
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(2))
		// A reserve too small for gVisor's own overhead: the kernel's OOM kill
		// comes before the agent's budget.
		warmPool(wrappers.Pool(ns, "tight").Replicas(1).Memory("512Mi", "8Mi"))
	})

	reason := func(ex *sandboxv1alpha1.Execution) string {
		c := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
		Expect(c).NotTo(BeNil())
		return c.Reason
	}
	const hog = "hog = []\nfor i in range(1000):\n    hog.append(bytearray(4 << 20))\n" +
		"    if i % 10 == 0:\n        print('allocated', (i + 1) * 4, 'MB', flush=True)"

	It("raises MemoryError at the memory budget, keeps the output, and the pool runs the next Execution", func() {
		ex := execute(wrappers.Execution(ns, "memory").Pool("py").Code(hog).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		Expect(reason(ex)).To(Equal(sandboxv1alpha1.ReasonMemoryLimitExceeded))
		Expect(ex.Status.Error.Type).To(Equal("MemoryError"))
		Expect(ex.Status.Stdout).To(ContainSubstring("allocated 204 MB\n"))
		Expect(execute(wrappers.Execution(ns, "after-memory").Pool("py").Code("print('next')").Obj()).Status.Stdout).To(Equal("next\n"))
	})

	It("stops a fork loop at a limit it names, with the output so far", func() {
		ex := execute(wrappers.Execution(ns, "forks").Pool("py").Timeout(time.Minute).Code(`import os, time
print('forking', flush=True)
n = 0
while True:
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
    n += 1
    if n % 10 == 0:
        print(n, flush=True)`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		// Under gVisor a forked Python costs about 14 MiB (copy on write in
		// 2 MiB units): memory runs out before the process limit.
		Expect(reason(ex)).To(BeElementOf(sandboxv1alpha1.ReasonMemoryLimitExceeded, sandboxv1alpha1.ReasonProcessLimitReached))
		Expect(ex.Status.Stdout).To(HavePrefix("forking\n10\n"))
	})

	It("refuses threads past the process limit with an error the code sees", func() {
		ex := execute(wrappers.Execution(ns, "threads").Pool("py").Code(`import threading, time
threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(300,), daemon=True)
    t.start()
    threads.append(t)
    if len(threads) % 20 == 0:
        print(len(threads), flush=True)`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		Expect(reason(ex)).To(Equal(sandboxv1alpha1.ReasonProcessLimitReached))
		Expect(ex.Status.Error.Message).To(Equal("can't start new thread"))
		Expect(ex.Status.Stdout).To(ContainSubstring("\n100\n"), "about 115 threads fit in the default limit of 128")
	})

	It("gives code that fills /tmp and /workspace ENOSPC, not an eviction, and names the limit", func() {
		ex := execute(wrappers.Execution(ns, "disk").Pool("py").Timeout(2 * time.Minute).Code(`import os
def fill(path):
    with open(path, 'wb') as f:
        n = 0
        while True:
            f.write(b'x' * (1 << 20))
            f.flush()
            n += 1
            if n % 64 == 0:
                print(path, n, 'MiB', flush=True)
try:
    fill('/tmp/fill')
except OSError as e:
    print('tmp full:', e.errno, os.path.getsize('/tmp/fill') >> 20, 'MiB', flush=True)
with open('/workspace/note', 'w') as f:
    f.write('the workspace is another filesystem')
fill('/workspace/fill')`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		Expect(reason(ex)).To(Equal(sandboxv1alpha1.ReasonDiskLimitReached))
		Expect(ex.Status.Error.Type).To(Equal("OSError"))
		Expect(ex.Status.Error.Message).To(HavePrefix("[Errno 28] No space left on device"))
		// The default sizes: 256Mi of /tmp, 1Gi of /workspace.
		Expect(ex.Status.Stdout).To(MatchRegexp(`(?m)^tmp full: 28 25[0-6] MiB$`))
		Expect(ex.Status.Stdout).To(ContainSubstring("/workspace/fill 960 MiB\n"))
		Expect(ex.Status.Stdout).NotTo(ContainSubstring("/workspace/fill 1088 MiB"))
	})

	It("says OOMKilled, with the output streamed before, when the container is killed at its memory limit", func() {
		ex := execute(wrappers.Execution(ns, "oom").Pool("tight").Code(hog).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		Expect(reason(ex)).To(Equal(sandboxv1alpha1.ReasonOOMKilled))
		Expect(ex.Status.Stdout).To(ContainSubstring("allocated 204 MB\n"))
	})

	It("interrupts code that burns every core at its timeout, the agent answering throughout", func() {
		ex := execute(wrappers.Execution(ns, "cpu").Pool("py").Timeout(15 * time.Second).Code(`import os
print('burning', flush=True)
for i in range(3):
    if os.fork() == 0:
        while True:
            pass
while True:
    pass`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseTimedOut), "%+v", ex.Status)
		Expect(ex.Status.Error.Type).To(Equal("KeyboardInterrupt"))
		Expect(ex.Status.Stdout).To(Equal("burning\n"))
	})
})

// The rest of the bad-input catalogue on gVisor: code that crashes its
// interpreter, floods its output, breaks its streams, ignores the interrupt or
// waits for input ends with a status that names what happened and the output
// it printed; each runs on a fresh pod of a default pool.
var _ = Describe("the bad-input catalogue", Ordered, func() {
	var ns string
	BeforeAll(func() {
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(2).GracePeriod(2 * time.Second))
	})

	type want struct {
		phase             sandboxv1alpha1.ExecutionPhase
		reason, errorType string
		message, stdout   string // substrings of the Complete condition's message and of stdout
		stdoutTruncated   bool
		stderrTruncated   bool
		resultPrefix      string
		timeout           time.Duration
	}
	DescribeTable("ends hostile code with a status that names it",
		func(code string, w want) {
			ex := wrappers.Execution(ns, "bad").Pool("py").Code(code)
			if w.timeout > 0 {
				ex.Timeout(w.timeout)
			}
			obj := ex.Obj()
			obj.Name, obj.GenerateName = "", "bad-"
			got := execute(obj)
			st := got.Status
			Expect(st.Phase).To(Equal(w.phase), "%+v", st)
			c := meta.FindStatusCondition(st.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
			Expect(c).NotTo(BeNil())
			Expect(c.Reason).To(Equal(w.reason))
			Expect(c.Message).To(ContainSubstring(w.message))
			if w.errorType != "" {
				Expect(st.Error).NotTo(BeNil())
				Expect(st.Error.Type).To(Equal(w.errorType))
			}
			Expect(st.Stdout).To(ContainSubstring(w.stdout))
			Expect(st.StdoutTruncated).To(Equal(w.stdoutTruncated))
			Expect(st.StderrTruncated).To(Equal(w.stderrTruncated))
			Expect(st.Result).To(HavePrefix(w.resultPrefix))
		},
		Entry("os._exit", "import os\nprint('bye', flush=True)\nos._exit(3)", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: "InterpreterDied", errorType: "InterpreterDied",
			message: "exit code 3", stdout: "bye\n"}),
		Entry("a segmentation fault", "print('before', flush=True)\nimport ctypes\nctypes.string_at(0)", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: "InterpreterDied", errorType: "InterpreterDied",
			message: "killed by signal 11", stdout: "before\n"}),
		Entry("sys.exit", "import sys\nprint('bye')\nsys.exit(3)", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: sandboxv1alpha1.ReasonError, errorType: "SystemExit",
			message: "the code called exit(3)", stdout: "bye\n"}),
		Entry("50 MB on stdout, 20,000 lines on stderr and a 10 MB result",
			"import sys\nprint('x' * 50_000_000)\nfor i in range(20_000):\n    print(i, file=sys.stderr)\n'y' * 10_000_000", want{
				phase: sandboxv1alpha1.PhaseSucceeded, reason: sandboxv1alpha1.ReasonSucceeded, stdout: "more bytes of stdout omitted",
				stdoutTruncated: true, stderrTruncated: true, resultPrefix: "'yyyy", timeout: 2 * time.Minute}),
		Entry("closed output streams", "import os\nprint('before')\nos.close(1)\nos.close(2)\nprint('lost')", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: sandboxv1alpha1.ReasonError, errorType: "OSError",
			message: "Bad file descriptor", stdout: "before\n"}),
		Entry("an ignored interrupt", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"+
			"print('stubborn', flush=True)\nwhile True:\n    time.sleep(0.1)", want{
			phase: sandboxv1alpha1.PhaseTimedOut, reason: sandboxv1alpha1.ReasonTimedOut, errorType: "InterpreterKilled",
			message: "did not stop at SIGINT at the timeout of 2s and was killed 2s later", stdout: "stubborn\n", timeout: 2 * time.Second}),
		Entry("input()", "print('asking')\ninput('name? ')", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: sandboxv1alpha1.ReasonError, errorType: "EOFError", stdout: "asking\n"}),
		Entry("endless recursion", "def f():\n    return f()\nf()", want{
			phase: sandboxv1alpha1.PhaseFailed, reason: sandboxv1alpha1.ReasonError, errorType: "RecursionError",
			message: "maximum recursion depth exceeded"}),
	)
})
