package controller_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// leaderElectionID is cmd/manager's: a follower started with it waits on the Lease.
const leaderElectionID = "manager.warmpool.dev"

// startFollower starts a second manager replica, as cmd/manager runs it with
// --mode=all under leader election, that never leads: the Lease is held by another holder for
// an hour. It serves the data plane on a port of its own. It returns that
// port; the replica stops with the spec.
func startFollower() int {
	GinkgoHelper()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: leaderElectionID},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a-leader-elsewhere"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	Expect(k8s.Create(ctx, lease)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, lease))).To(Succeed()) })

	mgr, port := startProcess(managerConfig(), func(opts *ctrl.Options) {
		opts.LeaderElection = true
		opts.LeaderElectionID = leaderElectionID
		opts.LeaderElectionNamespace = managerNamespace
	})
	Consistently(mgr.Elected(), 500*time.Millisecond).ShouldNot(BeClosed(), "the second replica must not lead")
	return port
}

// directTo returns a copy of c that calls the data plane of the replica on
// port itself, authenticated with cfg's client certificate, not through the
// API server's aggregator (which picks a replica of its own choosing).
func directTo(c *sessions.Client, cfg *rest.Config, port int) *sessions.Client {
	GinkgoHelper()
	tlsCfg, err := rest.TLSConfigFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	tlsCfg.InsecureSkipVerify, tlsCfg.RootCAs = true, nil // the replica's self-signed serving certificate
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg.Clone(), ForceAttemptHTTP2: false,
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	return c.WithDataPlane(fmt.Sprintf("https://127.0.0.1:%d", port), hc)
}

var _ = Describe("Two manager replicas", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("serves the data plane from a replica that is not the leader: it loads the agent keys too", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		port := startFollower()
		cfg := sessionUser(ns, "alice", true)
		c := sessionsClient(cfg)
		s, err := c.Create(ctx, ns, "on-follower", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		follower := directTo(c, cfg, port).Open(ns, s.Name)

		// The follower answers 503 only until its keys are loaded (a moment
		// after it starts), never 502 for a sandbox it cannot sign for. Until
		// it listens, the dial fails.
		var res *sessions.Result
		Eventually(func() error {
			res, err = follower.Run(ctx, sessions.ExecRequest{Code: "x = 6 * 7\nx"})
			var answer *sessions.Error
			if errors.As(err, &answer) && answer.Code != http.StatusServiceUnavailable &&
				// A replica that has just started may not have its client CA
				// yet: the caller's certificate is not verified (anonymous).
				(answer.Code != http.StatusForbidden || !strings.Contains(answer.Message, "system:anonymous")) {
				StopTrying("the follower failed the run").Wrap(err).Now()
			}
			return err
		}, 10*time.Second).Should(Succeed())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("42"))

		// Streamed, and the state is the Session's whichever replica serves.
		var out string
		res, err = follower.RunStream(ctx, sessions.ExecRequest{Code: "print(x, flush=True)"},
			sessions.Handlers{OnStdout: func(d string) { out += d }})
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("42\n"))
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "x + 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("43"), "the leader's replica reaches the same interpreter")
		v, err := follower.Variable(ctx, "x")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(v.JSON)).To(Equal("42"))
		Expect(getSession(ns, s.Name).Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
	})
})

// startDataPlaneOnly starts a process as the data-plane Deployment runs it
// (--mode=data-plane: no leader election, no controller) with the agent keys
// in the Secret keys of the manager's namespace, serving on a port of its own,
// which it returns. It stops with the spec.
func startDataPlaneOnly(keys string) int {
	GinkgoHelper()
	cfg := managerConfig()
	cfg.Mode, cfg.AgentKeysSecret = controller.ModeDataPlane, keys
	_, port := startProcess(cfg, func(*ctrl.Options) {})
	return port
}

// startProcess starts one more manager process with cfg, its data plane on a
// port of its own, and the suite's options as opts leaves them. It returns the
// manager and that port; the process stops with the spec.
func startProcess(cfg controller.Config, opts func(*ctrl.Options)) (ctrl.Manager, int) {
	GinkgoHelper()
	port, err := testenv.FreePort()
	Expect(err).NotTo(HaveOccurred())
	dp := dataPlane
	dp.Port = port
	cfg.DataPlane = &dp
	o := managerOptions()
	o.Cache = controller.CacheOptions(cfg.KeysSecret())
	opts(&o)
	mgr, err := ctrl.NewManager(env.Config, o)
	Expect(err).NotTo(HaveOccurred())
	mctx, cancel := context.WithCancel(context.Background())
	Expect(controller.Setup(mctx, mgr, cfg)).To(Succeed())
	done := make(chan struct{})
	go func() { defer GinkgoRecover(); defer close(done); Expect(mgr.Start(mctx)).To(Succeed()) }()
	DeferCleanup(func() { cancel(); <-done })
	return mgr, port
}

var _ = Describe("A data-plane replica told to stop", func() {
	It("reports not ready at once, lets the run it streams end, and only then stops", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		cfg := sessionUser(ns, "alice", true)
		c := sessionsClient(cfg)
		s, err := c.Create(ctx, ns, "drained", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.WaitReady(ctx)
		Expect(err).NotTo(HaveOccurred())

		// A replica as the Deployment runs it: data plane only, with a drain.
		port, err := testenv.FreePort()
		Expect(err).NotTo(HaveOccurred())
		health, err := testenv.FreePort()
		Expect(err).NotTo(HaveOccurred())
		dcfg := managerConfig()
		dcfg.Mode = controller.ModeDataPlane
		dp := dataPlane
		dp.Port, dp.ShutdownDelay, dp.DrainTimeout = port, time.Second, 20*time.Second
		dcfg.DataPlane = &dp
		o := managerOptions()
		o.Cache = controller.CacheOptions(dcfg.KeysSecret())
		o.HealthProbeBindAddress = fmt.Sprintf("127.0.0.1:%d", health)
		mgr, err := ctrl.NewManager(env.Config, o)
		Expect(err).NotTo(HaveOccurred())
		mctx, stop := context.WithCancel(context.Background())
		Expect(controller.Setup(mctx, mgr, dcfg)).To(Succeed())
		stopped := make(chan struct{})
		go func() { defer GinkgoRecover(); defer close(stopped); Expect(mgr.Start(mctx)).To(Succeed()) }()
		DeferCleanup(func() { stop(); <-stopped })
		ready := func() int {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
			if err != nil {
				return 0
			}
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		Eventually(ready).Should(Equal(http.StatusOK))

		direct := directTo(c, cfg, port).Open(ns, s.Name)
		Eventually(func() error { _, err := direct.Run(ctx, sessions.ExecRequest{Code: "1"}); return err }).Should(Succeed(), "it serves")
		started := make(chan struct{})
		type outcome struct {
			res *sessions.Result
			err error
			out string
		}
		result := make(chan outcome, 1)
		go func() {
			defer GinkgoRecover()
			var o outcome
			o.res, o.err = direct.RunStream(ctx, sessions.ExecRequest{Code: "import time\nprint('a', flush=True)\ntime.sleep(4)\nprint('b')\n'done'"},
				sessions.Handlers{OnStdout: func(d string) {
					if o.out == "" {
						close(started)
					}
					o.out += d
				}})
			result <- o
		}()
		select {
		case <-started:
		case o := <-result:
			Fail(fmt.Sprintf("the run ended before it printed: %+v %v", o.res, o.err))
		case <-time.After(30 * time.Second):
			Fail("the run printed nothing in 30 s")
		}
		stop()
		Eventually(ready, 2*time.Second, 50*time.Millisecond).Should(Equal(http.StatusInternalServerError), "not ready once told to stop")
		Consistently(stopped, 2*time.Second).ShouldNot(BeClosed(), "it stopped with a run under way")
		var got outcome
		Eventually(result, 30*time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred())
		Expect(got.res.Status).To(Equal(sessions.StatusSucceeded), "%+v", got.res.Error)
		Expect(*got.res.Result).To(Equal("'done'"))
		Expect(got.out).To(Equal("a\nb\n"), "streamed whole through the stopping replica")
		Eventually(stopped, 10*time.Second).Should(BeClosed(), "it stops once its runs ended")
	})
})

var _ = Describe("A data-plane-only process", func() {
	It("refuses a mode it does not know, and the data-plane mode without a port", func() {
		for _, cfg := range []controller.Config{{Mode: "everything"}, {Mode: controller.ModeDataPlane}} {
			mgr, err := ctrl.NewManager(env.Config, managerOptions())
			Expect(err).NotTo(HaveOccurred())
			Expect(controller.Setup(ctx, mgr, cfg)).To(MatchError(ContainSubstring("mode")))
		}
	})

	It("waits for the controllers' keys without writing them, then serves a Ready Session while no controller runs", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		cfg := sessionUser(ns, "alice", true)
		c := sessionsClient(cfg)
		s, err := c.Create(ctx, ns, "dp-only", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "n = 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)

		// A Secret name of its own, so that it finds none: the controllers
		// create the keys, the data plane's role cannot.
		keys := types.NamespacedName{Namespace: managerNamespace, Name: "dp-only-keys-" + ns}
		dp := directTo(c, cfg, startDataPlaneOnly(keys.Name)).Open(ns, s.Name)
		Eventually(func() error { _, err := dp.Run(ctx, sessions.ExecRequest{Code: "n"}); return err }).
			Should(Satisfy(func(err error) bool { return sessions.IsStatus(err, http.StatusServiceUnavailable) }), "it serves")
		Consistently(func(g Gomega) {
			_, err := dp.Run(ctx, sessions.ExecRequest{Code: "n"})
			g.Expect(sessions.IsStatus(err, http.StatusServiceUnavailable)).To(BeTrue(), "answers 503 until it has keys: %v", err)
			g.Expect(apierrors.IsNotFound(k8s.Get(ctx, keys, &corev1.Secret{}))).To(BeTrue(), "it must not create the keys Secret")
		}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

		// The controllers' keys, as they would have written them.
		real := &corev1.Secret{}
		Expect(k8s.Get(ctx, managerConfig().KeysSecret(), real)).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: keys.Namespace, Name: keys.Name},
			Data: real.Data})).To(Succeed())
		DeferCleanup(func() {
			Expect(k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: keys.Namespace, Name: keys.Name}})).To(Succeed())
		})
		Eventually(func() error { _, err := dp.Run(ctx, sessions.ExecRequest{Code: "n += 1"}); return err }).Should(Succeed())

		By("stopping the controllers")
		stopManager()
		<-managerDone
		DeferCleanup(startManager)
		for i := 3; i <= 12; i++ {
			res, err := dp.Run(ctx, sessions.ExecRequest{Code: "n += 1\nn"})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
			Expect(*res.Result).To(Equal(fmt.Sprint(i)), "each run once, on the Session's interpreter")
		}
		Expect(getSession(ns, s.Name).Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
	})
})
