package controller_test

import (
	"context"
	"errors"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	corev1 "k8s.io/api/core/v1"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// grantRuns lets user create one-call runs (runs/exec in data.warmpool.dev) in ns.
func grantRuns(ns, user string) {
	GinkgoHelper()
	name := user + "-runs"
	Expect(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{sessions.Group}, Resources: []string{"runs/exec"}, Verbs: []string{"create"}}}})).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}})).To(Succeed())
}

// cutTransport is a transport that sends a one-call run and drops its
// answer after d, as a data-plane replica that dies or a network that
// breaks does; before is a transport that never sends it.
type cutTransport struct {
	rt     http.RoundTripper
	after  time.Duration
	before bool
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.Contains(r.URL.Path, "/runs/") {
		return c.rt.RoundTrip(r)
	}
	if c.before {
		return nil, errors.New("connection refused (test)")
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.after)
	defer cancel()
	resp, err := c.rt.RoundTrip(r.WithContext(ctx))
	if err == nil {
		<-ctx.Done()
		_ = resp.Body.Close()
	}
	return nil, errors.New("connection reset (test)")
}

func cutClient(cfg *rest.Config, cut *cutTransport) *sessions.Client {
	GinkgoHelper()
	rt, err := rest.TransportFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	cut.rt = rt
	return sessionsClient(cfg).WithDataPlane(cfg.Host, &http.Client{Transport: cut})
}

var _ = Describe("One-call runs", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("lease a warm interpreter, run the first code and close the Session, in one request", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		cfg := sessionUser(ns, "alice", true)
		grantRuns(ns, "alice")
		c := sessionsClient(cfg)

		var out strings.Builder
		res, s, err := c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "python", ExecRequest: sessions.ExecRequest{
			Code: "import os\nprint(context['q'], os.environ['WHO'])\n6 * 7", Context: []byte(`{"q": "why"}`), Env: map[string]string{"WHO": "alice"}}},
			sessions.Handlers{OnStdout: func(d string) { out.WriteString(d) }})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("42"))
		Expect(out.String()).To(Equal("why alice\n"))

		// The Session was made for alice, who owns it, names its run, and is closed.
		ses := getSession(ns, s.Name)
		Expect(ses.Spec.Owner).To(Equal("alice"))
		Expect(ses.Annotations).To(HaveKey(sandboxv1alpha1.AnnotationRun))
		Eventually(func() sandboxv1alpha1.SessionPhase { return getSession(ns, s.Name).Status.Phase }).
			Should(Equal(sandboxv1alpha1.SessionClosed))

		// Kept: the Session stays Ready for the next run, with its state.
		res, kept, err := c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "python", Keep: true,
			ExecRequest: sessions.ExecRequest{Code: "n = 41"}}, sessions.Handlers{})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		res, err = kept.Run(ctx, sessions.ExecRequest{Code: "n + 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("42"))
		Expect(getSession(ns, kept.Name).Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(kept.Close(ctx)).To(Succeed())
	})

	It("refuse a caller who may not create Sessions, and nothing is created", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		// Control: alice, with the rights, gets her run.
		grantRuns(ns, "alice")
		_, _, err := sessionsClient(sessionUser(ns, "alice", true)).RunOnce(ctx, ns,
			sessions.RunRequest{Pool: "python", ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		Expect(err).NotTo(HaveOccurred())

		// mallory may create runs and use Sessions' data plane, not create Sessions.
		grantRuns(ns, "mallory")
		Expect(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{sessions.Group}, Resources: []string{"sessions/exec", "sessions/executions"},
				Verbs: []string{"create", "get"}}}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "mallory"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "mallory"}}})).To(Succeed())
		malloryCfg, err := env.UserConfig("mallory")
		Expect(err).NotTo(HaveOccurred())
		_, _, err = sessionsClient(malloryCfg).RunOnce(ctx, ns,
			sessions.RunRequest{Pool: "python", Session: "mallorys", ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		var notRun *sessions.NotRunError
		Expect(errors.As(err, &notRun)).To(BeTrue(), "%v", err)
		Expect(sessions.IsStatus(errors.Unwrap(err), http.StatusForbidden)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`may not create sessions.sandbox.warmpool.dev`))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mallorys"}, &sandboxv1alpha1.Session{}))).To(BeTrue())

		// The data plane's right to set another user as owner is its own: a
		// user who may create Sessions still cannot.
		forged := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "forged"},
			Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.PoolReference{Name: "python"}, Owner: "bob"}}
		aliceObjects, err := client.New(sessionUser(ns, "alice2", false), client.Options{Scheme: k8s.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		err = aliceObjects.Create(ctx, forged)
		Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.owner must be the user creating"))
	})

	It("say the code did not run when no pod came in time, and close the Session", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").MaxPods(1).Obj())
		cfg := sessionUser(ns, "alice", true)
		grantRuns(ns, "alice")
		c := sessionsClient(cfg)
		hold, err := c.Create(ctx, ns, "holds-the-pod", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = hold.Close(context.Background()) })

		_, s, err := c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "python", WaitMillis: 1500,
			ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		var notRun *sessions.NotRunError
		Expect(errors.As(err, &notRun)).To(BeTrue(), "%v", err)
		Expect(sessions.IsStatus(errors.Unwrap(err), http.StatusGatewayTimeout)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("NoIdleSandbox"))
		Eventually(func() sandboxv1alpha1.SessionPhase { return getSession(ns, s.Name).Status.Phase }).
			Should(Equal(sandboxv1alpha1.SessionClosed))

		_, _, err = c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "nope", ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		Expect(sessions.IsStatus(errors.Unwrap(err), http.StatusNotFound)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`SandboxPool "nope" not found`))

		// A wait longer than the data plane holds a request for is refused, before any Session.
		_, s, err = c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "python", WaitMillis: (2 * time.Hour).Milliseconds(),
			ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		Expect(sessions.IsStatus(errors.Unwrap(err), http.StatusBadRequest)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("waitMillis"))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.Name}, &sandboxv1alpha1.Session{}))).To(BeTrue())
	})

	It("tell a caller whose answer was lost whether the code ran, and never run it twice", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		cfg := sessionUser(ns, "alice", true)
		grantRuns(ns, "alice")

		// Never sent: the client says so.
		_, _, err := cutClient(cfg, &cutTransport{before: true}).RunOnce(ctx, ns,
			sessions.RunRequest{Pool: "python", ExecRequest: sessions.ExecRequest{Code: "1"}}, sessions.Handlers{})
		var notRun *sessions.NotRunError
		Expect(errors.As(err, &notRun)).To(BeTrue(), "%v", err)

		// Sent, and the answer lost while the code runs: the client finds the
		// run by its ID, waits for its result, and the code ran once.
		res, s, err := cutClient(cfg, &cutTransport{after: 700 * time.Millisecond}).RunOnce(ctx, ns,
			sessions.RunRequest{Pool: "python", ExecRequest: sessions.ExecRequest{
				Code: "import time\nruns = globals().get('runs', 0) + 1\ntime.sleep(1.5)\nruns"}}, sessions.Handlers{})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("1"), "the code ran once")
		// alice may delete Sessions, not patch them: the client deletes it.
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.Name}, &sandboxv1alpha1.Session{})
		}).Should(Satisfy(apierrors.IsNotFound), "the client ends the Session it recovered from")
	})
})

var _ = Describe("The data plane's pod claims", func() {
	It("let the data plane claim an idle pod for a run and give it back, and refuse it every other change of a pod", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		// The data plane's identity, with its role's right to update pods (config/dataplane/role.yaml).
		const dataPlane = "system:serviceaccount:warmpool-system:warmpool-data-plane"
		Expect(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-plane"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "update"}}}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-plane"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "data-plane"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "warmpool-system", Name: "warmpool-data-plane"}}})).To(Succeed())
		dp, err := env.ClientAs(dataPlane, "system:serviceaccounts")
		Expect(err).NotTo(HaveOccurred())
		// A Session holds one pod; the other is idle.
		Expect(k8s.Create(ctx, wrappers.Session(ns, "held").Pool("python").Obj())).To(Succeed())
		// Ready may be stored before the claim lands (a lease sends both at once): wait for the claim.
		heldName := sessionIn(ns, "held", sandboxv1alpha1.SessionReady).Status.PodName
		Eventually(func() string { return lease.Session(getPodOf(ns, heldName)) }).Should(Equal("held"))
		var idle *corev1.Pod
		Eventually(func() *corev1.Pod {
			for _, p := range poolPods(ns, "python") {
				if p.Name != heldName && sandboxpod.IsIdle(&p) {
					idle = p.DeepCopy()
				}
			}
			return idle
		}).ShouldNot(BeNil())
		// Each change is made to the pod as it is now: a write of the pod's
		// status in between is a conflict, which says nothing about the policy.
		refused := func(name string, change func(*corev1.Pod), want string) {
			GinkgoHelper()
			var err error
			for {
				pod := getPodOf(ns, name)
				change(pod)
				if err = dp.Update(ctx, pod); !apierrors.IsConflict(err) {
					break
				}
			}
			Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		}

		refused(idle.Name, func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.invalid/evil" },
			"not its spec, owners or finalizers")
		refused(idle.Name, func(p *corev1.Pod) { p.Labels[sandboxpod.LabelPool] = "another" },
			"only a sandbox pod's claim labels")
		heldUID := string(getSession(ns, "held").UID)
		refused(idle.Name, func(p *corev1.Pod) { p.Annotations[sandboxpod.AnnotationSessionUID] = heldUID },
			"only a sandbox pod's claim labels")
		// A pod a Session holds is not the data plane's to claim.
		run := wrappers.Session(ns, "held").Owner("alice").Obj()
		run.Annotations = map[string]string{sandboxv1alpha1.AnnotationRun: "r-1"}
		refused(heldName, func(p *corev1.Pod) {
			p.Annotations[sandboxpod.AnnotationRun], p.Annotations[sandboxpod.AnnotationRunOwner] = "r-1", "alice"
		}, "may claim only an idle sandbox pod")

		// What it may: claim the idle pod for a run, and give it back.
		run.Name = "fresh"
		idle = getPodOf(ns, idle.Name)
		before := idle.DeepCopy()
		Expect(lease.ClaimForRun(ctx, dp, idle, run, time.Now())).To(Succeed())
		Expect(lease.Session(idle)).To(Equal("fresh"))
		Expect(lease.UnclaimRun(ctx, dp, before, idle)).To(Succeed())
		Expect(lease.Session(getPodOf(ns, idle.Name))).To(BeEmpty())
	})
})
