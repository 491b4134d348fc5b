//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

const e2eTenantLabel = "e2e.warmpool.dev/tenant"

// tenantNamespace makes a namespace the shared pool's selector picks.
func tenantNamespace() string {
	GinkgoHelper()
	ns := newNamespace()
	Expect(k8s.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+e2eTenantLabel+`":"yes"}}}`)))).To(Succeed())
	return ns
}

// sessionsAs is a data-plane client acting as user.
func sessionsAs(user string) *sessions.Client {
	GinkgoHelper()
	cfg := rest.CopyConfig(restConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := sessions.New(cfg)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// sessionPod is the pod a Ready Session holds, in the shared pool's namespace.
func sessionPod(s *sessions.Session) corev1.Pod {
	GinkgoHelper()
	obj, err := s.Get(ctx)
	Expect(err).NotTo(HaveOccurred())
	p := &corev1.Pod{}
	Expect(k8s.Get(ctx, obj.PodKey(), p)).To(Succeed())
	return *p
}

func getExecution(ex *sandboxv1alpha1.Execution) *sandboxv1alpha1.Execution {
	GinkgoHelper()
	got := &sandboxv1alpha1.Execution{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
	return got
}

func waitingReason(ex *sandboxv1alpha1.Execution) func(g Gomega) string {
	return func(g Gomega) string {
		got := &sandboxv1alpha1.Execution{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
		for _, c := range got.Status.Conditions {
			if c.Type == sandboxv1alpha1.ExecutionConditionWaitingForSandbox && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
		}
		return ""
	}
}

var _ = Describe("a pool shared by two tenants", Ordered, ContinueOnFailure, func() {
	var (
		shared, a, b string
		pool         *sandboxv1alpha1.SandboxPool
		ref          func(w *wrappers.ExecutionWrapper) *wrappers.ExecutionWrapper
	)

	BeforeAll(func() {
		// The namespace the manager shares pools from by default: the platform's.
		shared = tenancy.DefaultSharedNamespaces[0]
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shared}}); err != nil {
			Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "create namespace %s: %v", shared, err)
		}
		DeferCleanup(func() {
			_ = k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shared}})
		})
		a, b = tenantNamespace(), tenantNamespace()
		bindRole(a, "alice", "edit")
		bindRole(b, "bob", "edit")
		pool = warmPool(wrappers.Pool(shared, "python").Replicas(2).
			Shared(map[string]string{e2eTenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{MaxPods: ptr.To[int32](2)}))
		ref = func(w *wrappers.ExecutionWrapper) *wrappers.ExecutionWrapper { return w.SharedPool(shared, pool.Name) }
	})

	It("runs each tenant's code on pods of its own, within its limit, and none for a namespace it does not admit", func() {
		ea := execute(ref(wrappers.Execution(a, "hello")).Code("print('from a')").Obj())
		Expect(ea.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ea.Status)
		Expect(ea.Status.Stdout).To(Equal("from a\n"))
		Expect(ea.Status.PodName).NotTo(BeEmpty())
		By("the pod that ran a's code is deleted (reusePolicy Never): it never serves b")
		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, ea.PodKey(), p)
			return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		}).WithTimeout(time.Minute).Should(BeTrue())
		eb := execute(ref(wrappers.Execution(b, "hello")).Code("print('from b')").Obj())
		Expect(eb.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", eb.Status)
		Expect(eb.Status.PodName).NotTo(Equal(ea.Status.PodName))

		By("a holds its two pods; its third run waits while b's runs")
		var long []*sandboxv1alpha1.Execution
		for i := range 2 {
			ex := ref(wrappers.Execution(a, fmt.Sprintf("long-%d", i))).Timeout(2 * time.Minute).Code("import time; time.sleep(90)").Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			long = append(long, ex)
		}
		for _, ex := range long {
			Eventually(func(g Gomega) sandboxv1alpha1.ExecutionPhase {
				got := &sandboxv1alpha1.Execution{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
				return got.Status.Phase
			}).WithTimeout(2 * time.Minute).Should(Equal(sandboxv1alpha1.PhaseRunning))
		}
		third := ref(wrappers.Execution(a, "third")).Code("print('third')").Obj()
		Expect(k8s.Create(ctx, third)).To(Succeed())
		Eventually(waitingReason(third)).WithTimeout(time.Minute).Should(Equal(sandboxv1alpha1.ReasonTenantLimitReached))
		other := execute(ref(wrappers.Execution(b, "meanwhile")).Code("print('b runs')").Obj())
		Expect(other.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the control: the pool had room, only a was at its limit")
		Expect(getExecution(third).Status.PodName).To(BeEmpty())
		for _, ex := range long {
			Expect(k8s.Patch(ctx, ex, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"cancel":true}}`)))).To(Succeed())
		}
		Expect(finished(third, 2*time.Minute).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))

		By("a namespace the selector does not pick waits, saying why")
		out := ref(wrappers.Execution(newNamespace(), "outsider")).Code("print(1)").Obj()
		Expect(k8s.Create(ctx, out)).To(Succeed())
		Eventually(waitingReason(out)).WithTimeout(time.Minute).Should(Equal(sandboxv1alpha1.ReasonNamespaceNotAdmitted))
		Consistently(func() string { return getExecution(out).Status.PodName }).WithTimeout(3 * time.Second).Should(BeEmpty())
	})

	It("keeps a tenant from the shared pods: no rights on them, no network path, no other tenant's Session", func() {
		By("RBAC: each tenant may list and exec into pods of its namespace (the control), none of the shared pool's")
		victim := idlePod(pool)
		for user, own := range map[string]string{"alice": a, "bob": b} {
			Expect(can(user, "list", "pods", own)).To(Equal("yes"))
			Expect(can(user, "create", "pods", own, "--subresource", "exec")).To(Equal("yes"))
			for _, verb := range []string{"list", "get", "watch"} {
				Expect(can(user, verb, "pods", shared)).To(Equal("no"), "%s %s pods in %s", user, verb, shared)
			}
			Expect(can(user, "create", "pods", shared, "--subresource", "exec")).To(Equal("no"))
			Expect(can(user, "get", "sandboxpools.sandbox.warmpool.dev", shared)).To(Equal("no"))
			out, err := kubectlOut("-n", shared, "exec", victim.Name, "--as", user, "--", "true")
			Expect(err).To(HaveOccurred(), "%s exec'd into a shared pod", user)
			Expect(out).To(ContainSubstring("forbidden"))
		}

		By("the data plane: alice runs in her Session on the shared pool (the control); bob gets 403 on it")
		aliceC, bobC := sessionsAs("alice"), sessionsAs("bob")
		as, err := aliceC.Create(ctx, a, "mine-", shared+"/"+pool.Name, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = as.Close(context.Background()) })
		res, err := as.Run(ctx, sessions.ExecRequest{Code: "secret = 'alice'; print(secret)"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Stdout).To(Equal("alice\n"))
		_, err = bobC.Open(a, as.Name).Run(ctx, sessions.ExecRequest{Code: "print(secret)"})
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "bob ran in alice's Session: %v", err)
		bs, err := bobC.Create(ctx, b, "mine-", shared+"/"+pool.Name, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = bs.Close(context.Background()) })
		res, err = bs.Run(ctx, sessions.ExecRequest{Code: "print('bob')"})
		Expect(err).NotTo(HaveOccurred(), "bob runs in his own Session (the control)")
		Expect(res.Stdout).To(Equal("bob\n"))
		_, err = aliceC.Open(b, bs.Name).Run(ctx, sessions.ExecRequest{Code: "print(1)"})
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "alice ran in bob's Session: %v", err)
		alicePod, bobPod := sessionPod(as), sessionPod(bs)
		Expect(alicePod.Labels).To(HaveKeyWithValue(sandboxpod.LabelTenant, a))
		Expect(bobPod.Labels).To(HaveKeyWithValue(sandboxpod.LabelTenant, b))

		By("the network: from the node the agents answer (the control); from a pod of a's namespace and from a's code, they do not")
		Expect(agentStatus(bobPod, "")).To(Equal(http.StatusUnauthorized), "bob's agent listens")
		Expect(agentStatus(alicePod, "")).To(Equal(http.StatusUnauthorized), "alice's agent listens")
		idle := idlePod(pool)
		targets := map[string]target{
			"bob-session-agent": {Kind: "http", URL: agentURL(bobPod)},
			"idle-shared-agent": {Kind: "http", URL: agentURL(idle)},
		}
		fromPod := probeFromPod(a, startProbePod(a, "probe"), targets)
		for name := range targets {
			Expect(fromPod[name]).To(beBlocked(), "a pod of a's namespace reached %s: %s", name, fromPod[name])
		}
		fromCode, self := probeAs(ref(wrappers.Execution(a, "probe")), targets)
		Expect(fromCode["bob-session-agent"]).To(beBlocked(), "a's code reached bob's Session: %s", fromCode["bob-session-agent"])
		if self != idle.Name { // its own pod is no crossing (no policy applies to a pod's traffic to itself)
			Expect(fromCode["idle-shared-agent"]).To(beBlocked(), "a's code reached another shared pod: %s", fromCode["idle-shared-agent"])
		}
		fromB, _ := probeAs(ref(wrappers.Execution(b, "probe")), map[string]target{"alice-session-agent": {Kind: "http", URL: agentURL(alicePod)}})
		Expect(fromB["alice-session-agent"]).To(beBlocked(), "b's code reached alice's Session: %s", fromB["alice-session-agent"])

		By("the tokens: one signed for alice's pod opens it and not bob's")
		tok := agentToken(alicePod)
		Expect(agentStatus(alicePod, tok)).NotTo(Equal(http.StatusUnauthorized))
		Expect(agentStatus(bobPod, tok)).To(Equal(http.StatusUnauthorized))

		By("the pool's status counts each tenant")
		Eventually(func(g Gomega) []string {
			got := &sandboxv1alpha1.SandboxPool{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), got)).To(Succeed())
			var ns []string
			for _, t := range got.Status.Tenants {
				if t.Sessions > 0 {
					ns = append(ns, t.Namespace)
				}
			}
			return ns
		}).WithTimeout(time.Minute).Should(ConsistOf(a, b))
	})

	It("ends a tenant's Ready Session when the platform unlabels its namespace, refuses its next run, and stops listing it once it holds nothing", func() {
		c := tenantNamespace()
		bindRole(c, "carol", "edit")
		cs, err := sessionsAs("carol").Create(ctx, c, "revoked-", shared+"/"+pool.Name, nil)
		Expect(err).NotTo(HaveOccurred())
		res, err := cs.Run(ctx, sessions.ExecRequest{Code: "print('before')"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Stdout).To(Equal("before\n"))

		By("the platform unlabels the namespace")
		Expect(k8s.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c}},
			client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+e2eTenantLabel+`":null}}}`)))).To(Succeed())
		Eventually(func(g Gomega) string {
			obj, err := cs.Get(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(obj.Status.Phase).To(Equal(sandboxv1alpha1.SessionClosed))
			for _, cond := range obj.Status.Conditions {
				if cond.Type == sandboxv1alpha1.SessionConditionReady {
					return cond.Reason
				}
			}
			return ""
		}).WithTimeout(30*time.Second).Should(Equal(sandboxv1alpha1.ReasonNamespaceNotAdmitted), "its Session ends at once, not at its idle timeout")
		_, err = cs.Run(ctx, sessions.ExecRequest{Code: "print('after')"})
		Expect(sessions.IsStatus(err, http.StatusConflict)).To(BeTrue(), "the next run is refused: %v", err)
		Eventually(func(g Gomega) []sandboxv1alpha1.TenantUsage {
			got := &sandboxv1alpha1.SandboxPool{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), got)).To(Succeed())
			return got.Status.Tenants
		}).WithTimeout(time.Minute).ShouldNot(ContainElement(HaveField("Namespace", c)), "once it holds nothing, it is no tenant")
	})
})
