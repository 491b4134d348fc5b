package controller_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// One Session, two ways to run code in it: the data plane and Executions
// that name it. They share one interpreter, and queue on it.
var _ = Describe("Both paths on one Session", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	// streamInBackground starts a data-plane run and returns once it printed,
	// with a channel of its result.
	streamInBackground := func(s *sessions.Session, code string) <-chan *sessions.Result {
		GinkgoHelper()
		started := make(chan struct{})
		var once sync.Once
		done := make(chan *sessions.Result, 1)
		go func() {
			defer GinkgoRecover()
			res, err := s.RunStream(ctx, sessions.ExecRequest{Code: code},
				sessions.Handlers{OnStdout: func(string) { once.Do(func() { close(started) }) }})
			Expect(err).NotTo(HaveOccurred())
			done <- res
		}()
		Eventually(started, 10*time.Second).Should(BeClosed())
		return done
	}

	It("queues an Execution behind a data-plane run and a data-plane run behind an Execution, keeping the pod and the state", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "mix", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		pod := getSession(ns, "mix").Status.PodName

		dp := streamInBackground(s, "import time\nprint('dp', flush=True)\ntime.sleep(2)\nshared = 1")
		ex := run(wrappers.Execution(ns, "after-dp").Session("mix").Code("shared + 1").Timeout(30 * time.Second).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(ex.Status.Result).To(Equal("2"), "it ran after the data-plane run, on its state")
		var res *sessions.Result
		Expect(dp).To(Receive(&res))
		Expect(res.Status).To(Equal(sessions.StatusSucceeded))

		// Running is stored before the code is sent: wait until it runs in
		// the interpreter (it leaves a file in the pod's workspace).
		slow := wrappers.Execution(ns, "before-dp").Session("mix").
			Code("open('started', 'w').close()\nimport time\ntime.sleep(2)\nshared = 10").Obj()
		Expect(k8s.Create(ctx, slow)).To(Succeed())
		Eventually(func() error {
			_, err := os.Stat(filepath.Join(kubelet.Dir, ns, pod, "workspace", "started"))
			return err
		}).Should(Succeed())
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "shared + 1", TimeoutMillis: 30000})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("11"), "it ran after the Execution, on its state")
		Expect(finished(slow).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))

		Expect(getSession(ns, "mix").Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(getSession(ns, "mix").Status.PodName).To(Equal(pod))
		Expect(sessionPodGone(ns, pod)()).To(BeFalse(), "the Session's pod is kept")
	})

	It("ends an Execution that waited past its timeout for a data-plane run as SessionBusy, without running it or losing the Session", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "busy", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		pod := getSession(ns, "busy").Status.PodName

		dp := streamInBackground(s, "import time\nprint('dp', flush=True)\ntime.sleep(4)\nn = 1")
		ex := run(wrappers.Execution(ns, "impatient").Session("busy").Code("n = 100").Timeout(time.Second).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseTimedOut), "%+v", ex.Status)
		Expect(ex.Status.Error.Type).To(Equal(sandboxv1alpha1.ReasonSessionBusy))
		Expect(strings.Contains(ex.Status.Error.Message, "never ran")).To(BeTrue(), ex.Status.Error.Message)
		var res *sessions.Result
		Eventually(dp, 10*time.Second).Should(Receive(&res))
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "the data-plane run was not disturbed")

		res, err = s.Run(ctx, sessions.ExecRequest{Code: "n"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("1"), "the Execution's code never ran")
		Expect(getSession(ns, "busy").Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(sessionPodGone(ns, pod)()).To(BeFalse())
	})

	It("keeps a Session whose shell command runs past its idle timeout", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "sh", "python",
			&sessions.Options{IdleTimeout: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "sleep 5; echo done", Language: "shell"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(res.Stdout).To(Equal("done\n"))
		Expect(getSession(ns, "sh").Status.Phase).To(Equal(sandboxv1alpha1.SessionReady),
			"a run in progress is activity, whatever its language")
		// And idle it still ends.
		sessionIn(ns, "sh", sandboxv1alpha1.SessionClosed)
	})
})
