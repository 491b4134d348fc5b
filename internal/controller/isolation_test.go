package controller_test

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// keysSecret reads the manager's agent keys Secret, as an administrator would.
func keysSecret() *corev1.Secret {
	s := &corev1.Secret{}
	Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: agentkeys.DefaultSecret}, s)
	}).Should(Succeed())
	return s
}

func currentKeyID() string { return string(keysSecret().Data[agentauth.CurrentKey]) }

// agentOf returns a client of a pod's agent that sends token.
func agentOf(pod *corev1.Pod, token string) *agentclient.Client {
	addr, err := kubelet.Address(pod)
	Expect(err).NotTo(HaveOccurred())
	return agentclient.New(addr, token)
}

var _ = Describe("Isolation", func() {
	It("keeps a NetworkPolicy and a disruption budget per pool, and puts them back when changed or deleted", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		np := &networkingv1.NetworkPolicy{}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "python"}, np) }).Should(Succeed())
		Expect(np.OwnerReferences).To(ConsistOf(HaveField("Kind", "SandboxPool")))
		Expect(np.Spec.PolicyTypes).To(ConsistOf(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))
		Expect(np.Spec.Egress).To(BeEmpty(), "no egress by default, DNS included")
		Expect(np.Spec.Ingress).To(HaveLen(1))
		Expect(np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels).To(HaveKeyWithValue("kubernetes.io/metadata.name", managerNamespace))
		pdb := &policyv1.PodDisruptionBudget{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "python"}, pdb)).To(Succeed())
		Expect(pdb.Spec.Selector.MatchLabels).To(HaveKeyWithValue(sandboxpod.LabelState, sandboxpod.StateBusy))

		By("a tenant opening egress in the policy by hand: the operator puts it back")
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}} // one empty rule allows everything
		Expect(k8s.Update(ctx, np)).To(Succeed())
		Eventually(func() []networkingv1.NetworkPolicyEgressRule {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(np), np)).To(Succeed())
			return np.Spec.Egress
		}).Should(BeEmpty())

		By("deleting the policy: it comes back")
		uid := np.UID
		Expect(k8s.Delete(ctx, np)).To(Succeed())
		Eventually(func() error {
			got := &networkingv1.NetworkPolicy{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(np), got); err != nil {
				return err
			}
			if got.UID == uid {
				return errFmt("still the old policy")
			}
			return nil
		}).Should(Succeed())

		By("an egress allowlist on the pool: the policy follows, with link-local cut out")
		changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{
				{CIDR: "0.0.0.0/0", Ports: []sandboxv1alpha1.EgressPort{{Port: 443}}}}}
		})
		Eventually(func() []networkingv1.NetworkPolicyEgressRule {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(np), np)).To(Succeed())
			return np.Spec.Egress
		}).Should(ConsistOf(HaveField("To", ConsistOf(HaveField("IPBlock.Except", ContainElement("169.254.0.0/16"))))))
		Eventually(func() string {
			c := meta.FindStatusCondition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionNetworkPolicyReady)
			if c == nil {
				return ""
			}
			return c.Message
		}).Should(ContainSubstring("egress to the 1 destinations"))
	})

	It("says so in the pool's status when a foreign object holds the policy's name", func() {
		ns := newNamespace()
		foreign := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "python"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		Expect(k8s.Create(ctx, foreign)).To(Succeed())
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "python").Obj())).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionNetworkPolicyReady)
		}).Should(And(Not(BeNil()), HaveField("Status", "False"), HaveField("Reason", sandboxv1alpha1.ReasonPolicyFailed),
			HaveField("Message", ContainSubstring("not owned by the pool"))))
	})

	It("names the other policies that select the pool's pods and allow them traffic", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "python").Obj())).To(Succeed())
		policy := func() *metaCondition {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionNetworkPolicyReady)
		}
		Eventually(policy).Should(And(Not(BeNil()), HaveField("Reason", sandboxv1alpha1.ReasonPolicyApplied)))

		By("a default-deny policy for the namespace changes nothing; an allow-all one re-opens the pods")
		both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		Expect(k8s.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default-deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: both}})).To(Succeed())
		allowAll := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-all-egress"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: both, Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
		Expect(k8s.Create(ctx, allowAll)).To(Succeed())
		Eventually(policy).Should(And(HaveField("Status", "True"),
			HaveField("Reason", sandboxv1alpha1.ReasonOtherPoliciesApply),
			HaveField("Message", And(ContainSubstring("allow-all-egress"), Not(ContainSubstring("default-deny"))))))
		Eventually(func() []eventsv1.Event { return eventsOf(ns, "python") }).Should(ContainElement(And(
			HaveField("Type", corev1.EventTypeWarning), HaveField("Reason", sandboxv1alpha1.ReasonOtherPoliciesApply))))

		By("deleting it: the pool's own policy is all there is again")
		Expect(k8s.Delete(ctx, allowAll)).To(Succeed())
		Eventually(policy).Should(HaveField("Reason", sandboxv1alpha1.ReasonPolicyApplied))
	})

	It("gives each agent credentials that open that pod alone, and none the code could read", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		pods := poolPods(ns, "python")
		Expect(pods).To(HaveLen(2))
		a, b := &pods[0], &pods[1]
		keys, err := agentauth.ParseKeyring(keysSecret().Data)
		Expect(err).NotTo(HaveOccurred())
		tokA, err := keys.Token(string(a.UID), a.Labels[sandboxpod.LabelAgentKey])
		Expect(err).NotTo(HaveOccurred())

		req := protocol.ExecuteRequest{ID: "probe", Code: "1+1"}
		res, err := agentOf(a, tokA).Execute(ctx, req)
		Expect(err).NotTo(HaveOccurred(), "a token opens its own pod")
		Expect(res.Result).To(HaveValue(Equal("2")))

		By("the attack: pod A's token (all that code in A could ever capture) against pod B")
		_, err = agentOf(b, tokA).Execute(ctx, req)
		Expect(agentclient.IsStatus(err, http.StatusUnauthorized)).To(BeTrue(), "want 401, got %v", err)
		_, err = agentOf(b, "").Execute(ctx, req)
		Expect(agentclient.IsStatus(err, http.StatusUnauthorized)).To(BeTrue(), "no token: want 401, got %v", err)

		By("what the code in a sandbox can see holds no credential")
		ex := run(wrappers.Execution(ns, "look").Code(`import os
found = [k for k in os.environ if 'TOKEN' in k.upper() or 'SECRET' in k.upper()]
found += [p for p in ('/var/run/warmpool', '/var/run/secrets/kubernetes.io') if os.path.exists(p)]
found`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(ex.Status.Result).To(Equal("[]"))
	})

	It("rotates the signing key without cutting off running code, and replaces idle pods that trust the old key", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		oldKey := currentKeyID()
		long := wrappers.Execution(ns, "long").Code("import time\ntime.sleep(3)\nprint('done')").Obj()
		Expect(k8s.Create(ctx, long)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(long).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))

		By("an administrator adds a key and makes it current")
		newKey := "k" + time.Now().Format("150405")
		secret := keysSecret()
		secret.Data[newKey] = agentauth.NewSeed()
		secret.Data[agentauth.CurrentKey] = []byte(newKey)
		Expect(k8s.Update(ctx, secret)).To(Succeed())

		Eventually(func() []string {
			var keys []string
			for _, p := range poolPods(ns, "python") {
				if sandboxpod.IsIdle(&p) {
					keys = append(keys, p.Labels[sandboxpod.LabelAgentKey])
				}
			}
			return keys
		}, 30*time.Second).Should(And(HaveLen(2), HaveEach(newKey)), "idle pods are rolled to the new key")
		done := finished(long)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the run that began under %s finished", oldKey)
		Expect(done.Status.Stdout).To(Equal("done\n"))
		Expect(run(wrappers.Execution(ns, "after").Code("print('new key')").Obj()).Status.Stdout).To(Equal("new key\n"))
	})

	It("reads codeFrom only from objects their owner marked, so creating Executions never reads arbitrary Secrets", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
			StringData: map[string]string{"password": "hunter2"}})).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job",
			Labels: map[string]string{sandboxv1alpha1.LabelCodeSource: "true"}},
			StringData: map[string]string{"main.py": "print('marked')"}})).To(Succeed())

		By("the attack: have an unmarked Secret evaluated as code and read it back from the status")
		stolen := run(wrappers.Execution(ns, "steal").NoCode().CodeFromSecret("db", "password").Obj())
		Expect(stolen.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(stolen.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonCodeSourceNotMarked),
			HaveField("Message", ContainSubstring("kubectl label secret db sandbox.warmpool.dev/code=true"))))
		Expect(stolen.Status.PodName).To(BeEmpty(), "it never reached a sandbox")
		Expect(stolen.Status.Stdout + stolen.Status.Stderr + stolen.Status.Result + stolen.Status.Error.Message).
			NotTo(ContainSubstring("hunter2"))

		ok := run(wrappers.Execution(ns, "ok").NoCode().CodeFromSecret("job", "main.py").Obj())
		Expect(ok.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(ok.Status.Stdout).To(Equal("marked\n"))
	})

	It("uses pools of the Execution's own namespace only", func() {
		nsA, nsB := newNamespace(), newNamespace()
		createPoolAndWait(wrappers.Pool(nsB, "only-in-b").Obj())
		ex := wrappers.Execution(nsA, "cross").Pool("only-in-b").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getExec(ex).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(And(Not(BeNil()), HaveField("Reason", sandboxv1alpha1.ReasonPoolNotFound)))
		Consistently(func() string { return getExec(ex).Status.PodName }, 2*time.Second).Should(BeEmpty())
	})

	It("keeps a namespace that enforces Pod Security 'restricted' warm", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wp-restricted-", Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
		Expect(k8s.Create(ctx, ns)).To(Succeed())
		By("the API server refuses a pod that breaks 'restricted' in this namespace")
		bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "root"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		Expect(k8s.Create(ctx, bad)).To(MatchError(ContainSubstring("violates PodSecurity \"restricted:latest\"")))
		createPoolAndWait(wrappers.Pool(ns.Name, "python").Replicas(2).Obj())
		Expect(run(wrappers.Execution(ns.Name, "hi").Code("print('restricted')").Obj()).Status.Stdout).To(Equal("restricted\n"))
	})
})

type errFmt string

func (e errFmt) Error() string { return string(e) }
