package controller_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const tenantLabel = "warmpool.dev/tenant"

// sharedNamespace is the namespace the manager shares pools from by default
// (tenancy.DefaultSharedNamespaces), emptied after the spec.
func sharedNamespace() string {
	name := tenancy.DefaultSharedNamespaces[0]
	err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	DeferCleanup(func() { cleanNamespace(name) })
	return name
}

// tenantNamespace is a new namespace the shared pools' selector picks.
func tenantNamespace() string {
	ns := newNamespace()
	obj := &corev1.Namespace{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, obj)).To(Succeed())
	obj.Labels = map[string]string{tenantLabel: "yes"}
	Expect(k8s.Update(ctx, obj)).To(Succeed())
	return ns
}

func podOf(ex *sandboxv1alpha1.Execution, poolNS string) *corev1.Pod {
	GinkgoHelper()
	p := &corev1.Pod{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: ex.Status.PodName}, p)).To(Succeed())
	return p
}

func waitingReason(ex *sandboxv1alpha1.Execution) func() string {
	return func() string {
		if c := condition(getExec(ex).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox); c != nil {
			return c.Reason
		}
		return ""
	}
}

var _ = Describe("A shared pool", func() {
	It("serves two tenant namespaces from its own namespace, a pod never running both's code", func() {
		shared, a, b, outsider := sharedNamespace(), tenantNamespace(), tenantNamespace(), newNamespace()
		createPoolAndWait(wrappers.Pool(shared, "python").Replicas(2).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).
			Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{}).Obj())

		first := run(wrappers.Execution(a, "first").SharedPool(shared, "python").Code("secret = 'a'; print('a ran')").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", first.Status)
		Expect(first.Status.Stdout).To(Equal("a ran\n"))
		aPod := podOf(first, shared)
		Expect(aPod.Labels).To(HaveKeyWithValue(sandboxpod.LabelTenant, a), "the pod records whose code it ran")

		second := run(wrappers.Execution(b, "second").SharedPool(shared, "python").Code("print('b ran')").Obj())
		Expect(second.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", second.Status)
		Expect(second.Status.PodName).NotTo(Equal(aPod.Name), "b never gets the pod that ran a's code, even reset")
		Expect(podOf(second, shared).Labels).To(HaveKeyWithValue(sandboxpod.LabelTenant, b))

		// a's next run may take a's reset pod again (reuse within one namespace), never b's.
		third := run(wrappers.Execution(a, "third").SharedPool(shared, "python").Code("print('a again')").Obj())
		Expect(third.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", third.Status)
		Expect(third.Status.PodName).NotTo(Equal(second.Status.PodName))

		By("a namespace outside the selector waits, saying why")
		out := wrappers.Execution(outsider, "out").SharedPool(shared, "python").Code("print(1)").Obj()
		Expect(k8s.Create(ctx, out)).To(Succeed())
		Eventually(waitingReason(out)).Should(Equal(sandboxv1alpha1.ReasonNamespaceNotAdmitted))
		Consistently(func() string { return getExec(out).Status.PodName }, "2s").Should(BeEmpty())

		By("a pool that is not shared serves no other namespace")
		createPoolAndWait(wrappers.Pool(a, "private").Obj())
		intruder := wrappers.Execution(b, "intruder").SharedPool(a, "private").Code("print(1)").Obj()
		Expect(k8s.Create(ctx, intruder)).To(Succeed())
		Eventually(waitingReason(intruder)).Should(Equal(sandboxv1alpha1.ReasonPoolNotShared))
		Consistently(func() string { return getExec(intruder).Status.PodName }, "2s").Should(BeEmpty())

		pool := getPool(shared, "python")
		Expect(condition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionShared)).To(HaveField("Status", Equal("True")))
		for _, t := range pool.Status.Tenants {
			Expect(t.Namespace).NotTo(Equal(outsider), "a namespace the pool does not admit is no tenant of it")
		}
	})

	It("keeps its reserve idle above its replicas, and refills it as soon as a tenant takes from it", func() {
		shared, a := sharedNamespace(), tenantNamespace()
		Expect(k8s.Create(ctx, wrappers.Pool(shared, "python").Replicas(1).
			Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{}).Reserve(3).Obj())).To(Succeed())
		idle := func() int { return idleReady(shared, "python") }
		Eventually(idle).Should(Equal(3), "a reserve of 3 exists only as 3 idle pods, though replicas is 1")
		Consistently(idle, "2s").Should(Equal(3), "the pool does not trim its reserve back to its replicas")

		By("a tenant holding none takes a reserved pod; the pool replaces it at once")
		ses := wrappers.Session(a, "s").SharedPool(shared, "python").Obj()
		Expect(k8s.Create(ctx, ses)).To(Succeed())
		sessionIn(a, "s", sandboxv1alpha1.SessionReady)
		Eventually(idle).Should(Equal(3))
		Expect(getPool(shared, "python").Spec.Replicas).To(BeEquivalentTo(1))
	})

	It("holds a tenant at its limit while another is served, and keeps Sessions of one name apart", func() {
		shared, a, b := sharedNamespace(), tenantNamespace(), tenantNamespace()
		createPoolAndWait(wrappers.Pool(shared, "python").Replicas(2).
			Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{MaxPods: ptr.To[int32](1)}).Obj())

		for ns, v := range map[string]string{a: "from a", b: "from b"} {
			ses := wrappers.Session(ns, "s").SharedPool(shared, "python").Obj()
			Expect(k8s.Create(ctx, ses)).To(Succeed())
			sessionIn(ns, "s", sandboxv1alpha1.SessionReady)
			set := run(wrappers.Execution(ns, "set").SharedPool(shared, "python").Session("s").Code("x = '" + v + "'").Obj())
			Expect(set.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", set.Status)
		}
		Eventually(func() []sandboxv1alpha1.TenantUsage { return getPool(shared, "python").Status.Tenants }).Should(ConsistOf(
			sandboxv1alpha1.TenantUsage{Namespace: a, Pods: 1, Sessions: 1}, sandboxv1alpha1.TenantUsage{Namespace: b, Pods: 1, Sessions: 1}))
		for ns, v := range map[string]string{a: "from a", b: "from b"} {
			got := run(wrappers.Execution(ns, "get").SharedPool(shared, "python").Session("s").Code("print(x)").Obj())
			Expect(strings.TrimSpace(got.Status.Stdout)).To(Equal(v), "each namespace's Session s keeps its own state")
		}

		By("a, holding its one pod with its Session, waits; when it closes the Session, it runs")
		waits := wrappers.Execution(a, "waits").SharedPool(shared, "python").Code("print('ran')").Obj()
		Expect(k8s.Create(ctx, waits)).To(Succeed())
		Eventually(waitingReason(waits)).Should(Equal(sandboxv1alpha1.ReasonTenantLimitReached))
		Consistently(func() string { return getExec(waits).Status.PodName }, "2s").Should(BeEmpty())
		closeSession(a, "s")
		Expect(finished(waits).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
	})

	It("ends a tenant's Sessions when its namespace loses its admission, after the run under way, and lists it while it holds a pod", func() {
		shared, a := sharedNamespace(), tenantNamespace()
		createPoolAndWait(wrappers.Pool(shared, "python").Replicas(1).
			Shared(map[string]string{tenantLabel: "yes"}, sandboxv1alpha1.TenantLimits{}).Obj())
		Expect(k8s.Create(ctx, wrappers.Session(a, "s").SharedPool(shared, "python").Obj())).To(Succeed())
		sessionIn(a, "s", sandboxv1alpha1.SessionReady)
		long := wrappers.Execution(a, "long").SharedPool(shared, "python").Session("s").
			Code("import time\ntime.sleep(2)\nprint('finished')").Obj()
		Expect(k8s.Create(ctx, long)).To(Succeed())
		waitClaimed(long)

		By("the platform unlabels the namespace")
		obj := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: a}, obj)).To(Succeed())
		obj.Labels = map[string]string{}
		Expect(k8s.Update(ctx, obj)).To(Succeed())
		Eventually(func() []sandboxv1alpha1.TenantUsage { return getPool(shared, "python").Status.Tenants }).Should(
			ContainElement(HaveField("Namespace", a)), "a namespace that holds a pod is listed, admitted or not")

		Expect(finished(long).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the run under way finishes")
		closed := sessionIn(a, "s", sandboxv1alpha1.SessionClosed)
		Expect(condition(closed.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonNamespaceNotAdmitted), HaveField("Message", ContainSubstring("no longer use the pool"))))
		next := wrappers.Execution(a, "next").SharedPool(shared, "python").Session("s").Code("print(1)").Obj()
		Expect(k8s.Create(ctx, next)).To(Succeed())
		Eventually(waitingReason(next)).Should(Equal(sandboxv1alpha1.ReasonNamespaceNotAdmitted), "nothing follows")
		Consistently(func() string { return getExec(next).Status.PodName }, "2s").Should(BeEmpty())
		Eventually(func() []sandboxv1alpha1.TenantUsage { return getPool(shared, "python").Status.Tenants }).ShouldNot(
			ContainElement(HaveField("Namespace", a)), "once it holds nothing, it is no tenant")
	})
})
