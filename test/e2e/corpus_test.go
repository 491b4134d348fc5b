//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
	"github.com/warmpool/warmpool/test/hostile"
)

// The hostile-program corpus's e2e subset (test/hostile, programs marked
// e2e) under gVisor: the descriptor, deadline, forgery and reach cases in
// Sessions (each program, then the next run of the same Session), and the
// hand-over cases as Executions on a FreshInterpreter pool of one pod, where
// the next Execution runs on the same pod after the wipe and must find
// nothing of the last one.
var _ = Describe("the hostile-program corpus under gVisor", Ordered, Label("corpus"), func() {
	var ns string
	var c *sessions.Client
	var programs []*hostile.Program
	// e2eSlack is what the cluster adds to an agent's timing (durations are
	// the agent's own, so little).
	const e2eSlack = time.Second

	BeforeAll(func() {
		corpus, err := hostile.Corpus()
		Expect(err).NotTo(HaveOccurred())
		for _, p := range corpus {
			if p.E2E {
				programs = append(programs, p)
			}
		}
		Expect(len(programs)).To(BeNumerically(">=", 12), "the e2e subset")
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "corpus").Replicas(2).Timeout(30 * time.Second).GracePeriod(time.Second))
		warmPool(wrappers.Pool(ns, "handover").Replicas(1).MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).
			Timeout(30 * time.Second).GracePeriod(time.Second))
		c, err = sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
	})

	It("keeps the interpreter in namespaces of its own under gVisor", func() {
		s, err := c.Create(ctx, ns, "containment-", "corpus", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(ctx) })
		// A user namespace that maps one UID, and a PID namespace whose init
		// is the interpreter.
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "import os\n(open('/proc/self/uid_map').read().split()[2], os.getpid())"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("('1', 1)"))
	})

	It("ends each program as it must, and the next run says what it lost", func() {
		for _, p := range programs {
			if p.HandOver || !p.RunsIn(hostile.ModeSandbox, "namespaces") {
				continue
			}
			By(p.Name + ": " + p.Description)
			s, err := c.Create(ctx, ns, "corpus-", "corpus", nil)
			Expect(err).NotTo(HaveOccurred())
			res, err := s.Run(ctx, sessions.ExecRequest{Code: "kept = 'yes'"})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded))

			res, err = s.Run(ctx, sessions.ExecRequest{Code: p.Code, TimeoutMillis: p.Timeout.Milliseconds(), GraceMillis: p.Grace.Milliseconds()})
			Expect(err).NotTo(HaveOccurred(), p.Name)
			what := fmt.Sprintf("%s: %s, stateLost %v (%q), error %+v, %.0f ms, stdout %.200q", p.Name, res.Status, res.StateLost,
				res.StateLostReason, res.Error, res.DurationMillis, res.Stdout)
			Expect(res.Status).To(Equal(p.WantStatus("namespaces")), what)
			Expect(res.StateLost).To(Equal(p.StateLost), what)
			if p.ErrorType != "" {
				Expect(res.Error).NotTo(BeNil(), what)
				Expect(res.Error.Type).To(Equal(p.ErrorType), what)
			}
			if p.Stdout != nil {
				Expect(res.Stdout).To(Equal(*p.Stdout), what)
			}
			Expect(time.Duration(res.DurationMillis*float64(time.Millisecond))).To(BeNumerically("<=", p.Within+e2eSlack), what)
			time.Sleep(p.Pause)

			next, err := s.Run(ctx, sessions.ExecRequest{Code: "('kept' in globals(), 6 * 7)", TimeoutMillis: 20000})
			if p.StateLost || p.NextStateLost {
				// The Session's state is gone: the next run says so (the code
				// does not run on a fresh interpreter as if nothing happened),
				// or the Session is already Lost.
				if err == nil {
					Expect(next.StateLost).To(BeTrue(), "%s: the next run: %+v", p.Name, next)
					Expect(next.Result).To(BeNil(), p.Name)
				} else {
					Expect(strings.ToLower(err.Error())).To(Or(ContainSubstring("lost"), ContainSubstring("restarted")), p.Name)
				}
			} else {
				Expect(err).NotTo(HaveOccurred(), p.Name)
				Expect(next.Status).To(Equal(sessions.StatusSucceeded), "%s: the next run: %+v", p.Name, next.Error)
				Expect(*next.Result).To(Equal("(True, 42)"), p.Name)
			}
			_ = s.Close(ctx)
		}
	})

	It("leaves nothing of one user to the next on a reused pod", func() {
		for _, p := range programs {
			if !p.HandOver || !p.RunsIn(hostile.ModeSandbox, "namespaces") {
				continue
			}
			By(p.Name + ": " + p.Description)
			first := execute(wrappers.Execution(ns, "ho-"+strings.ReplaceAll(p.Name, "_", "-")).Pool("handover").Code(p.Code).
				Timeout(p.Timeout).Obj())
			Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", p.Name, first.Status.Error)
			Expect(first.Status.PodDisposition).To(Equal(sandboxv1alpha1.DispositionReset), p.Name)
			next := execute(wrappers.Execution(ns, "ho-next-"+strings.ReplaceAll(p.Name, "_", "-")).Pool("handover").Code(p.Check).
				Timeout(20 * time.Second).Obj())
			Expect(next.Status.PodName).To(Equal(first.Status.PodName), "%s: the next user runs on the same pod, after the wipe", p.Name)
			Expect(next.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", p.Name, next.Status.Error)
			Expect(next.Status.Result).To(Equal("'clean'"), "%s: the next user found %s (stdout %q)", p.Name, next.Status.Result, next.Status.Stdout)
		}
	})
})
