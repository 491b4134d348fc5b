package controller_test

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// Hostile input, resource side (issue 11): code that reaches a limit ends
// with a status that names it, with what it printed.
var _ = Describe("Sandbox limits", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	completeReason := func(ex *sandboxv1alpha1.Execution) string {
		c := condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)
		Expect(c).NotTo(BeNil())
		return c.Reason
	}

	It("ends code that allocates past the memory budget MemoryLimitExceeded, with its output and a live interpreter", func() {
		// 256Mi less a 96Mi reserve: the code may use 160 MiB.
		createPoolAndWait(wrappers.Pool(ns, "python").Memory("256Mi", "96Mi").Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		ex := run(wrappers.Execution(ns, "hog").Code("hog = []\nfor i in range(40):\n    hog.append(bytearray(50 << 20))\n" +
			"    print('allocated', (i + 1) * 50, 'MB', flush=True)").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(completeReason(ex)).To(Equal(sandboxv1alpha1.ReasonMemoryLimitExceeded))
		Expect(ex.Status.Error.Type).To(Equal("MemoryError"))
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Message).To(
			ContainSubstring("MemoryError; the code may use 160 MiB in pool python"))
		Expect(ex.Status.Stdout).To(ContainSubstring("allocated 100 MB\n"))
		Expect(ex.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionReset), "the interpreter lived: the pod is reused")
	})

	It("kills processes that pass the memory budget together, and says so with the output so far", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Memory("256Mi", "96Mi").Obj())
		ex := run(wrappers.Execution(ns, "forks").Code(`import os, time
print('forking', flush=True)
for i in range(6):
    if os.fork() == 0:
        hog = bytearray(80 << 20)
        time.sleep(60)
        os._exit(0)
time.sleep(30)`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(completeReason(ex)).To(Equal(sandboxv1alpha1.ReasonMemoryLimitExceeded))
		Expect(ex.Status.Error.Type).To(Equal(sandboxv1alpha1.ReasonMemoryLimitExceeded))
		Expect(ex.Status.Error.Message).To(ContainSubstring("budget of 160 MiB"))
		Expect(ex.Status.Stdout).To(Equal("forking\n"))
		Expect(ex.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionDelete))
	})

	It("ends a write that finds no space DiskLimitReached, naming the pool's sizes", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		// /dev/full fails every write with ENOSPC, as a full /tmp does under
		// gVisor (the e2e suite fills the real one).
		ex := run(wrappers.Execution(ns, "full").Code("print('writing', flush=True)\n" +
			"with open('/dev/full', 'w') as f:\n    f.write('x' * 10)").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(completeReason(ex)).To(Equal(sandboxv1alpha1.ReasonDiskLimitReached))
		Expect(ex.Status.Error.Type).To(Equal("OSError"))
		Expect(ex.Status.Error.Message).To(HavePrefix("[Errno 28] No space left on device"))
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Message).To(
			ContainSubstring("pool python gives the code 1Gi in /workspace and 256Mi in /tmp"))
		Expect(ex.Status.Stdout).To(Equal("writing\n"))
		Expect(ex.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionDelete),
			"a fresh interpreter would inherit the full disk: the pod is not reused")
	})

	It("says OOMKilled, with the output streamed before, when the kernel kills the sandbox", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := wrappers.Execution(ns, "oom").Code("print('before the kill', flush=True)\nimport time\ntime.sleep(60)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		pod := waitClaimed(ex)
		// The output reaches the manager as it is printed: wait for it to be
		// there before the kill, as it would be for code that printed a while ago.
		time.Sleep(time.Second)
		Expect(kubelet.OOMKill(ns, pod)).To(BeTrue())
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(completeReason(done)).To(Equal(sandboxv1alpha1.ReasonOOMKilled))
		Expect(done.Status.Error.Message).To(ContainSubstring("more than its memory limit of 512Mi"))
		Expect(done.Status.Stdout).To(Equal("before the kill\n"))
	})

	It("says OOMKilled when the kernel kills a Session's sandbox, the pod kept until the Session read why", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "s").Obj())).To(Succeed())
		pod := sessionIn(ns, "s", sandboxv1alpha1.SessionReady).Status.PodName
		Expect(kubelet.OOMKill(ns, pod)).To(BeTrue())
		lost := sessionIn(ns, "s", sandboxv1alpha1.SessionLost)
		Expect(condition(lost.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonOOMKilled), HaveField("Message", ContainSubstring("more than its memory limit of 512Mi"))),
			"%+v", lost.Status)
		Eventually(sessionPodGone(ns, pod)).Should(BeTrue(), "then freed")
	})

	It("holds every run to the pool's maxTimeout and maxOutputBytes, whatever it asks for", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").MaxTimeout(time.Minute).MaxOutputBytes(4096).Obj())
		long := run(wrappers.Execution(ns, "long").Code("1").Timeout(24 * time.Hour).Obj())
		Expect(long.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(completeReason(long)).To(Equal(sandboxv1alpha1.ReasonTimeoutAboveLimit))
		Expect(long.Status.Error.Message).To(ContainSubstring("spec.timeout 24h0m0s is longer than pool python allows (spec.executionDefaults.maxTimeout 1m0s)"))
		Expect(long.Status.PodName).To(BeEmpty(), "it never took a pod")
		Expect(run(wrappers.Execution(ns, "within").Code("1").Timeout(time.Minute).Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))

		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "limits", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "1", TimeoutMillis: (2 * time.Minute).Milliseconds()})
		Expect(sessions.IsStatus(err, http.StatusBadRequest)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("timeoutMillis 120000 is longer than pool python allows"))
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "1", MaxOutputBytes: 8192})
		Expect(sessions.IsStatus(err, http.StatusBadRequest)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("maxOutputBytes 8192 is more than pool python keeps"))
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "1", TimeoutMillis: 1000})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded))
	})
})
