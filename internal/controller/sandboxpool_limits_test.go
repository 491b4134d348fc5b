package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

var _ = Describe("SandboxPool limits", func() {
	// envtest runs no quota controller: the test writes the quota's status as
	// it would (hard from spec, nothing used); the API server's quota
	// admission then counts each pod it admits into status.used.
	setQuota := func(q *corev1.ResourceQuota, pods string) {
		q.Spec.Hard = corev1.ResourceList{corev1.ResourcePods: resource.MustParse(pods)}
		Expect(k8s.Update(ctx, q)).To(Succeed())
		q.Status.Hard = q.Spec.Hard
		if q.Status.Used == nil {
			q.Status.Used = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}
		}
		Expect(k8s.Status().Update(ctx, q)).To(Succeed())
	}

	It("stops at the namespace's ResourceQuota, says so without calling the pool degraded, and grows when the quota does", func() {
		ns := newNamespace()
		quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandboxes"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}}}
		Expect(k8s.Create(ctx, quota)).To(Succeed())
		setQuota(quota, "2")

		pool := wrappers.Pool(ns, "python").Replicas(4).Obj()
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		limited := func() *metaCondition {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionScalingLimited)
		}
		Eventually(limited).Should(And(Not(BeNil()), HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonResourceQuota),
			HaveField("Message", And(ContainSubstring("2 more pods wanted"), ContainSubstring("exceeded quota")))))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
		Consistently(func() int { return len(poolPods(ns, "python")) }, "2s").Should(Equal(2))
		p := getPool(ns, "python")
		Expect(condition(p.Status.Conditions, sandboxv1alpha1.PoolConditionDegraded)).To(HaveField("Status", "False"))
		Expect(condition(p.Status.Conditions, sandboxv1alpha1.PoolConditionReady)).To(HaveField("Status", "False"))
		var evs eventsv1.EventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		quotaEvents := 0
		for _, e := range evs.Items {
			Expect(e.Reason).NotTo(Equal("CreatePodFailed"), "a quota refusal is not a failure")
			if e.Reason == sandboxv1alpha1.ReasonResourceQuota && e.Type == corev1.EventTypeWarning {
				quotaEvents++
			}
		}
		Expect(quotaEvents).To(Equal(1), "one event when the limit begins, not one per attempt")

		// An Execution still runs on a pod the quota allowed.
		ex := wrappers.Execution(ns, "under-quota").Code("print(6*7)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Expect(finished(ex).Status).To(And(HaveField("Phase", sandboxv1alpha1.PhaseSucceeded), HaveField("Stdout", "42\n")))

		// The namespace's owner raises the quota: the pool fills up without
		// any event of its own (the retry) and the limit clears.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(quota), quota)).To(Succeed())
		setQuota(quota, "10")
		Eventually(func() int { return idleReady(ns, "python") }, "30s").Should(Equal(4))
		Eventually(limited).Should(And(HaveField("Status", "False"), HaveField("Reason", sandboxv1alpha1.ReasonWithinLimits)))
	})

	It("says when maxPods keeps pods from Executions that wait", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Obj())
		var exs []*sandboxv1alpha1.Execution
		for _, name := range []string{"a", "b", "c"} {
			ex := wrappers.Execution(ns, name).Code("import time; time.sleep(1)").Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			exs = append(exs, ex)
		}
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionScalingLimited)
		}).Should(And(Not(BeNil()), HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonMaxPods),
			HaveField("Message", ContainSubstring("maxPods 1 reached"))))
		for _, ex := range exs {
			Expect(finished(ex).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		}
		Eventually(func() string {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionScalingLimited).Reason
		}).Should(Equal(sandboxv1alpha1.ReasonWithinLimits))
	})
})
