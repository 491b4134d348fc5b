package controller_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

var _ = Describe("SandboxPool", func() {
	It("fills to replicas with locked-down pods and reports its status", func() {
		ns := newNamespace()
		pool := createPoolAndWait(wrappers.Pool(ns, "python").Replicas(3).MaxPods(5).Obj())

		Expect(pool.Status.Replicas).To(BeEquivalentTo(3))
		Expect(pool.Status.ReadyReplicas).To(BeEquivalentTo(3))
		Expect(pool.Status.BusyReplicas).To(BeEquivalentTo(0))
		Expect(pool.Status.Selector).To(Equal("sandbox.warmpool.dev/pool=python"))
		Expect(pool.Status.ObservedGeneration).To(Equal(pool.Generation))
		Expect(meta.IsStatusConditionTrue(pool.Status.Conditions, sandboxv1alpha1.PoolConditionReady)).To(BeTrue())
		Expect(meta.IsStatusConditionFalse(pool.Status.Conditions, sandboxv1alpha1.PoolConditionDegraded)).To(BeTrue())

		Expect(meta.IsStatusConditionTrue(pool.Status.Conditions, sandboxv1alpha1.PoolConditionNetworkPolicyReady)).To(BeTrue())

		for _, p := range poolPods(ns, "python") {
			s := p.Spec
			Expect(p.OwnerReferences).To(HaveLen(1))
			Expect(*p.OwnerReferences[0].Controller).To(BeTrue())
			Expect(s.RuntimeClassName).To(HaveValue(Equal("gvisor")), "gVisor by default")
			Expect(s.AutomountServiceAccountToken).To(HaveValue(BeFalse()), "no service-account token")
			Expect(s.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
			Expect(s.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
			c := s.Containers[0]
			Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
			Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
			Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
			Expect(c.Resources.Limits).To(HaveKey(corev1.ResourceCPU))
			Expect(c.Resources.Limits).To(HaveKey(corev1.ResourceMemory))
			Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/v1/readyz"))
			var ws *corev1.Volume
			for i := range s.Volumes {
				if s.Volumes[i].Name == "workspace" {
					ws = &s.Volumes[i]
				}
			}
			Expect(ws).NotTo(BeNil())
			Expect(ws.EmptyDir.SizeLimit).NotTo(BeNil(), "the writable workspace is size-limited")
			for _, v := range s.Volumes {
				Expect(v.Secret).To(BeNil(), "no Secret in a sandbox: code could read it")
				Expect(v.Projected).To(BeNil())
			}
			Expect(c.Env).To(ContainElement(HaveField("ValueFrom.FieldRef.FieldPath", "metadata.uid")), "the agent learns its own pod UID")
			Expect(p.Labels).To(HaveKeyWithValue(sandboxpod.LabelAgentKey, currentKeyID()))
		}
	})

	It("lets a pool opt out of gVisor", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "trusted").RuntimeClass("").Obj())
		Expect(poolPods(ns, "trusted")[0].Spec.RuntimeClassName).To(BeNil())
	})

	It("scales up and down through /scale, never removing busy pods", func() {
		ns := newNamespace()
		pool := createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		busy := wrappers.Execution(ns, "busy").Code("import time; time.sleep(30)").Obj()
		Expect(k8s.Create(ctx, busy)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(busy).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))

		// As kubectl scale does: read the Scale, set replicas, write it back (again on a conflict).
		scaleTo := func(n int32) {
			Eventually(func() error {
				scale := &autoscalingv1.Scale{}
				if err := k8s.SubResource("scale").Get(ctx, pool, scale); err != nil {
					return err
				}
				scale.Spec.Replicas = n
				return k8s.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))
			}).Should(Succeed())
		}
		scaleTo(4)
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(4))

		scaleTo(0)
		Eventually(func() int { return len(poolPods(ns, "python")) }).Should(Equal(1))
		Expect(getExec(busy).Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning), "the busy pod must survive the scale-down")
		Eventually(func() int32 { return getPool(ns, "python").Status.BusyReplicas }).Should(BeEquivalentTo(1))
	})

	It("replaces a pod that fails or is deleted", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		victim := poolPods(ns, "python")[0]
		Expect(k8s.Delete(ctx, &victim)).To(Succeed())
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
		for _, p := range poolPods(ns, "python") {
			Expect(p.Name).NotTo(Equal(victim.Name))
		}
	})

	It("counts a resetting pod as warming, and replaces one whose reset never finished", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		stuck := poolPods(ns, "python")[0]
		patch := client.MergeFrom(stuck.DeepCopy())
		stuck.Labels[sandboxpod.LabelState] = sandboxpod.StateResetting
		if stuck.Annotations == nil {
			stuck.Annotations = map[string]string{}
		}
		stuck.Annotations[sandboxpod.AnnotationResetSince] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
		Expect(k8s.Patch(ctx, &stuck, patch)).To(Succeed())
		// Wait for the pool to settle on one pod: while the stuck pod is replaced it
		// may briefly hold a spare, which it trims (a resetting pod first) once both are up.
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(1))
		Eventually(func() int { return len(poolPods(ns, "python")) }).Should(Equal(1))
		Consistently(func() int { return len(poolPods(ns, "python")) }, "1s").Should(Equal(1))
		for _, p := range poolPods(ns, "python") {
			Expect(p.Name).NotTo(Equal(stuck.Name), "the stuck pod is replaced")
		}

		resetting := poolPods(ns, "python")[0]
		patch = client.MergeFrom(resetting.DeepCopy())
		resetting.Labels[sandboxpod.LabelState] = sandboxpod.StateResetting
		if resetting.Annotations == nil {
			resetting.Annotations = map[string]string{}
		}
		resetting.Annotations[sandboxpod.AnnotationResetSince] = time.Now().UTC().Format(time.RFC3339Nano)
		Expect(k8s.Patch(ctx, &resetting, patch)).To(Succeed())
		Eventually(func() int32 { return getPool(ns, "python").Status.IdleReplicas }).Should(BeZero())
		Consistently(func() int { return len(poolPods(ns, "python")) }, "2s").Should(Equal(1),
			"a pod in the middle of its reset is not replaced")
		Expect(hasSeries(metrics.PoolOldestWarming, ns, "python")).To(BeFalse(),
			"a resetting pod is not a pod that is starting (WarmpoolSandboxPodsNotReady would fire on it)")
	})

	It("says in Ready, its Status column and an Event when the scheduler finds no node for its pods", func() {
		ns := newNamespace()
		const why = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
		pool := wrappers.Pool(ns, "big").Obj()
		pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Metadata: sandboxv1alpha1.SandboxPodMetadata{
			Annotations: map[string]string{localkubelet.AnnotationUnschedulable: why}}}
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "big").Status.Conditions, sandboxv1alpha1.PoolConditionReady)
		}).Should(And(
			HaveField("Status", Equal("False")),
			HaveField("Reason", Equal(sandboxv1alpha1.ReasonUnschedulable)),
			HaveField("Message", And(ContainSubstring("cannot be scheduled: "+why), ContainSubstring("0 of 1 idle pods ready"))),
		))
		Expect(condition(getPool(ns, "big").Status.Conditions, sandboxv1alpha1.PoolConditionDegraded)).
			To(HaveField("Status", Equal("False")), "no node has room: a limit of the cluster, not a fault of the pool's pods")
		Eventually(func() []string {
			evs := &eventsv1.EventList{}
			Expect(k8s.List(ctx, evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				if e.Regarding.Name == "big" {
					reasons = append(reasons, e.Reason+": "+e.Note)
				}
			}
			return reasons
		}).Should(ContainElement(And(HavePrefix("Unschedulable: "), ContainSubstring("Insufficient cpu"))))
	})

	It("reports Degraded with the reason when pods cannot pull their image", func() {
		ns := newNamespace()
		pool := wrappers.Pool(ns, "broken").Image("registry.invalid/nope:1").Obj()
		pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Metadata: sandboxv1alpha1.SandboxPodMetadata{
			Annotations: map[string]string{localkubelet.AnnotationImagePullBackOff: ""}}}
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "broken").Status.Conditions, sandboxv1alpha1.PoolConditionDegraded)
		}).Should(And(
			HaveField("Status", Equal("True")),
			HaveField("Reason", Equal(sandboxv1alpha1.ReasonImagePullBackOff)),
			HaveField("Message", ContainSubstring("registry.invalid/nope:1")),
		))
		Consistently(func() int { return len(poolPods(ns, "broken")) }, 300*time.Millisecond).Should(Equal(1),
			"a pod that cannot start is not multiplied")

		// What the alerts of config/prometheus read: the condition, how long
		// the oldest pod has been starting, and how long work has waited.
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.PoolCondition.WithLabelValues(ns, "broken", sandboxv1alpha1.PoolConditionDegraded))
		}).Should(Equal(1.0))
		created := poolPods(ns, "broken")[0].CreationTimestamp.Unix()
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.PoolOldestWarming.WithLabelValues(ns, "broken"))
		}).Should(BeNumerically("~", created, 1))
		waiting := wrappers.Execution(ns, "waits").Pool("broken").Code("1").Obj()
		Expect(k8s.Create(ctx, waiting)).To(Succeed())
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.PoolOldestPending.WithLabelValues(ns, "broken"))
		}).Should(BeNumerically("~", getExec(waiting).CreationTimestamp.Unix(), 1))
		Expect(k8s.Delete(ctx, waiting)).To(Succeed())
		Eventually(func() bool { return hasSeries(metrics.PoolOldestPending, ns, "broken") }).Should(BeFalse(),
			"nothing waits: the series is gone")
	})
})

// hasSeries reports whether a pool's series of a gauge exists (asking for it
// with WithLabelValues would create it).
func hasSeries(g *prometheus.GaugeVec, namespace, pool string) bool {
	ch := make(chan prometheus.Metric, 64)
	go func() { g.Collect(ch); close(ch) }()
	found := false
	for m := range ch {
		var d dto.Metric
		Expect(m.Write(&d)).To(Succeed())
		labels := map[string]string{}
		for _, l := range d.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		found = found || (labels["namespace"] == namespace && labels["pool"] == pool)
	}
	return found
}
