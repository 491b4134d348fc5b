package api_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const (
	guardrailsLabel  = "sandbox.warmpool.dev/guardrails"
	guardrailsPolicy = "ValidatingAdmissionPolicy 'warmpool-guardrails'"
	paramsNamespace  = "warmpool-system"
	paramsName       = "warmpool-guardrails"
)

// guardrailsManifests renders config/guardrails as `kubectl apply -k` would.
func guardrailsManifests() (objs []*unstructured.Unstructured, params *unstructured.Unstructured) {
	GinkgoHelper()
	for _, obj := range kustomizeBuild("config/guardrails") {
		if obj.GetKind() == "ConfigMap" {
			params = obj
		}
		objs = append(objs, obj)
	}
	Expect(params).NotTo(BeNil(), "config/guardrails ships its parameters")
	Expect(params.GetNamespace()).To(Equal(paramsNamespace))
	Expect(params.GetName()).To(Equal(paramsName))
	return objs, params
}

func applyObject(obj *unstructured.Unstructured) {
	GinkgoHelper()
	obj = obj.DeepCopy()
	obj.SetManagedFields(nil)
	Expect(k8s.Patch(ctx, obj, client.Apply, client.FieldOwner("warmpool-test"), client.ForceOwnership)).
		To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
}

// setParams applies the shipped parameters with some keys changed.
func setParams(changes map[string]string) {
	GinkgoHelper()
	_, params := guardrailsManifests()
	for k, v := range changes {
		Expect(unstructured.SetNestedField(params.Object, v, "data", k)).To(Succeed())
	}
	applyObject(params)
}

// enforcedNamespace creates a namespace that opts into the guard rails.
func enforcedNamespace() string {
	GinkgoHelper()
	name := newNamespace()
	ns := &corev1.Namespace{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, ns)).To(Succeed())
	ns.Labels[guardrailsLabel] = "enforced"
	Expect(k8s.Update(ctx, ns)).To(Succeed())
	return name
}

// expectRefused asserts that err is the guard rails' refusal, saying msg.
func expectRefused(err error, msg string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the guard rails let through a pool they should refuse")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want 403 Forbidden, got %v", err)
	Expect(err.Error()).To(ContainSubstring(guardrailsPolicy))
	Expect(err.Error()).To(ContainSubstring(msg))
}

// dryRun creates obj without storing it: the API server admits it as it would a create.
func dryRun(obj client.Object) error {
	return k8s.Create(ctx, obj.DeepCopyObject().(client.Object), client.DryRunAll)
}

// The policy, its binding, the namespace labels and the parameters reach the
// API server's admission through informers. waitForGuardrails waits until the
// policy applies in ns with its parameters: a compliant pool passes and a pool
// that breaks every rail does not.
func waitForGuardrails(ns string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(dryRun(wrappers.Pool(ns, "probe").Obj())).To(Succeed(), "a compliant pool")
		bad := wrappers.Pool(ns, "probe").RuntimeClass("").Image("docker.io/library/python:3").Obj()
		bad.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("1Ti")}
		bad.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{{CIDR: "0.0.0.0/0"}}}
		g.Expect(dryRun(bad)).To(MatchError(ContainSubstring(guardrailsPolicy)), "a pool that breaks every rail")
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// waitForShippedGuardrails waits until every parameter in ns is back to the
// shipped value, after a test changed them.
func waitForShippedGuardrails(ns string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(dryRun(wrappers.Pool(ns, "probe").Obj())).To(Succeed(), "a compliant pool")
		err := dryRun(wrappers.Pool(ns, "probe").RuntimeClass("").Obj())
		g.Expect(err).To(MatchError(ContainSubstring(`spec.runtimeClassName must be "gvisor"`)))
		egress := wrappers.Pool(ns, "probe").Obj()
		egress.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{{CIDR: "10.0.0.0/8"}}}
		g.Expect(dryRun(egress)).To(MatchError(ContainSubstring("spec.network.egress is not allowed")))
		cpu := wrappers.Pool(ns, "probe").Obj()
		cpu.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2001m")}
		g.Expect(dryRun(cpu)).To(MatchError(ContainSubstring("maximum of 2 ")))
		memory := wrappers.Pool(ns, "probe").Obj()
		memory.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2049Mi")}
		g.Expect(dryRun(memory)).To(MatchError(ContainSubstring("maximum of 2Gi ")))
		g.Expect(dryRun(wrappers.Pool(ns, "probe").Image("registry.example.com/sandboxes/python:3.13").Obj())).
			To(MatchError(ContainSubstring(`use an image starting with "warmpool.dev/repl:" or "warmpool.dev/repl@"`)))
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

var _ = Describe("Guard rails (config/guardrails)", func() {
	var ns, open string

	BeforeEach(func() {
		system := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: paramsNamespace}}
		if err := k8s.Create(ctx, system); err != nil {
			Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "create %s: %v", paramsNamespace, err)
		}
		objs, _ := guardrailsManifests()
		for _, obj := range objs {
			applyObject(obj)
		}
		ns, open = enforcedNamespace(), newNamespace()
		waitForGuardrails(ns)
	})

	It("accepts pools that keep within the rails, and changes of them that do", func() {
		pool := wrappers.Pool(ns, "python").Obj()
		Expect(k8s.Create(ctx, pool)).To(Succeed(), "defaults: gvisor, the operator's default limits")
		pool.Spec.Replicas = 3
		Expect(k8s.Update(ctx, pool)).To(Succeed())

		Expect(k8s.Create(ctx, fromYAML(ns, `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: SandboxPool
metadata:
  name: at-the-bounds
spec:
  image: warmpool.dev/repl@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  runtimeClassName: gvisor
  resources:
    limits: {cpu: 2, memory: 2Gi}
    requests: {cpu: 2000m, memory: 2048Mi}
  network: {egress: []}
  limits: {memoryReserve: 64Mi}
  sessionIdleTimeout: 1h
  executionDefaults: {interruptGracePeriod: 30s}
`))).To(Succeed())
	})

	It("bounds a Session's own idle timeout, which overrides its pool's, in an enforced namespace only", func() {
		session := func(ns, name, idle string) client.Object {
			spec := "\n  poolRef: {name: python}"
			if idle != "" {
				spec += "\n  idleTimeout: " + idle
			}
			return fromYAML(ns, "apiVersion: sandbox.warmpool.dev/v1alpha1\nkind: Session\nmetadata:\n  name: "+name+"\nspec:"+spec+"\n")
		}
		Eventually(func() error { return dryRun(session(ns, "probe", "2h")) }).WithTimeout(30 * time.Second).
			Should(MatchError(ContainSubstring("ValidatingAdmissionPolicy 'warmpool-guardrails-sessions'")))
		err := k8s.Create(ctx, session(ns, "long", "12h"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want 403, got %v", err)
		Expect(err).To(MatchError(ContainSubstring("spec.idleTimeout is 12h, above this namespace's maximum of 1h (guard rails): set it to at most 1h")))
		Expect(k8s.Create(ctx, session(ns, "bounded", "1h"))).To(Succeed())
		Expect(k8s.Create(ctx, session(ns, "pools", ""))).To(Succeed(), "its pool's, which the pool's rail bounds")
		Expect(k8s.Create(ctx, session(open, "long", "12h"))).To(Succeed(), "the guard rails are opt-in per namespace")
	})

	DescribeTable("refuses a pool that leaves the rails in an enforced namespace, saying what to fix, and not elsewhere",
		func(spec, msg string) {
			manifest := poolHeader + spec
			expectRefused(k8s.Create(ctx, fromYAML(ns, manifest)), msg)
			Expect(k8s.Create(ctx, fromYAML(open, manifest))).To(Succeed(), "the guard rails are opt-in per namespace")
		},
		Entry("opting out of gVisor", `
  image: warmpool.dev/repl:1
  runtimeClassName: ""`, `spec.runtimeClassName must be "gvisor" in this namespace`),
		Entry("another runtime class", `
  image: warmpool.dev/repl:1
  runtimeClassName: runc`, `not "runc": remove the field or set it to "gvisor"`),
		Entry("an image from elsewhere", `
  image: docker.io/library/python:3`, `spec.image "docker.io/library/python:3" is not allowed in this namespace (guard rails): use an image starting with "warmpool.dev/repl:" or "warmpool.dev/repl@"`),
		Entry("an image that only shares the repository's name as a prefix", `
  image: warmpool.dev/repl-evil:1`, `spec.image "warmpool.dev/repl-evil:1" is not allowed`),
		Entry("a CPU limit above the bound", `
  image: warmpool.dev/repl:1
  resources: {limits: {cpu: 2500m}}`, "the sandbox CPU limit is 2500m, above this namespace's maximum of 2 (guard rails): set spec.resources.limits.cpu"),
		Entry("a CPU limit above the bound, as a number", `
  image: warmpool.dev/repl:1
  resources: {limits: {cpu: 3}}`, "the sandbox CPU limit is 3, above this namespace's maximum of 2"),
		Entry("a memory limit above the bound", `
  image: warmpool.dev/repl:1
  resources: {limits: {memory: 3Gi}}`, "the sandbox memory limit is 3Gi, above this namespace's maximum of 2Gi (guard rails): set spec.resources.limits.memory"),
		Entry("no limit but a request above the bound (the operator raises the limit to the request)", `
  image: warmpool.dev/repl:1
  resources: {requests: {cpu: "4"}}`, "the sandbox CPU limit is 4 (no spec.resources.limits.cpu: the operator's default, or the request if larger), above"),
		Entry("a longer maxTimeout than the bound", `
  image: warmpool.dev/repl:1
  executionDefaults: {maxTimeout: 24h}`, "spec.executionDefaults.maxTimeout is 24h, above this namespace's maximum of 1h (guard rails): set it to at most 1h"),
		Entry("a larger workspace than the bound", `
  image: warmpool.dev/repl:1
  limits: {workspaceSize: 500Gi}`, "spec.limits.workspaceSize is 500Gi, above this namespace's maximum of 2Gi (guard rails)"),
		Entry("a larger /tmp than the bound", `
  image: warmpool.dev/repl:1
  limits: {tmpSize: 2Gi}`, "spec.limits.tmpSize is 2Gi, above this namespace's maximum of 1Gi (guard rails)"),
		Entry("no process limit", `
  image: warmpool.dev/repl:1
  limits: {processes: 0}`, "spec.limits.processes is 0 (no limit), outside this namespace's bounds of 1 to 512 (guard rails)"),
		Entry("more processes than the bound", `
  image: warmpool.dev/repl:1
  limits: {processes: 4096}`, "spec.limits.processes is 4096, outside this namespace's bounds of 1 to 512"),
		Entry("egress", `
  image: warmpool.dev/repl:1
  network:
    egress:
    - cidr: 0.0.0.0/0
      ports: [{port: 443}]`, "spec.network.egress is not allowed in this namespace (guard rails)"),
		Entry("less memory kept for the agent than the bound", `
  image: warmpool.dev/repl:1
  limits: {memoryReserve: 16Mi}`, "spec.limits.memoryReserve is 16Mi, below this namespace's minimum of 64Mi (guard rails): set it to at least 64Mi"),
		Entry("Sessions that idle longer than the bound", `
  image: warmpool.dev/repl:1
  sessionIdleTimeout: 12h`, "spec.sessionIdleTimeout is 12h, above this namespace's maximum of 1h (guard rails): set it to at most 1h"),
		Entry("a longer interrupt grace than the bound", `
  image: warmpool.dev/repl:1
  executionDefaults: {interruptGracePeriod: 5m}`, "spec.executionDefaults.interruptGracePeriod is 5m, above this namespace's maximum of 30s (guard rails)"),
		Entry("a priority class (the kubelet's own)", `
  image: warmpool.dev/repl:1
  template: {spec: {priorityClassName: system-node-critical}}`, `spec.template.spec.priorityClassName "system-node-critical" is not allowed in this namespace (guard rails): remove it`),
		Entry("sharing the pool with other namespaces", `
  image: warmpool.dev/repl:1
  sharing:
    namespaceSelector: {}`, "spec.sharing is not allowed in this namespace (guard rails): tenant namespaces do not share"),
	)

	It("lets a pool from before the namespace was enforced be changed, but not further outside the rails", func() {
		legacy := newNamespace()
		pool := fromYAML(legacy, `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: SandboxPool
metadata:
  name: legacy
spec:
  image: docker.io/library/python:3
  runtimeClassName: ""
  resources: {limits: {cpu: "4", memory: 4Gi}}
  network:
    egress: [{cidr: 10.0.0.0/8}]
`)
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		nsObj := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: legacy}, nsObj)).To(Succeed())
		nsObj.Labels[guardrailsLabel] = "enforced"
		Expect(k8s.Update(ctx, nsObj)).To(Succeed())
		waitForGuardrails(legacy)
		key := client.ObjectKeyFromObject(pool)

		// change applies mutate to the stored pool with a typed Go client's
		// Update, which also rewrites some values (sessionIdleTimeout "10m"
		// comes back as "10m0s"): the checks must not mistake that for a change.
		change := func(mutate func(*sandboxv1alpha1.SandboxPool)) error {
			p := &sandboxv1alpha1.SandboxPool{}
			Expect(k8s.Get(ctx, key, p)).To(Succeed())
			mutate(p)
			return k8s.Update(ctx, p)
		}
		By("changes that leave what the rails check alone go through")
		Expect(change(func(p *sandboxv1alpha1.SandboxPool) { p.Labels = map[string]string{"team": "a"} })).To(Succeed())
		Expect(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Replicas = 3 })).To(Succeed())
		Expect(change(func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("3")
		})).To(Succeed(), "lowering a limit that is above the bound")
		p := &sandboxv1alpha1.SandboxPool{}
		Expect(k8s.Get(ctx, key, p)).To(Succeed())
		scale := &autoscalingv1.Scale{}
		Expect(k8s.SubResource("scale").Get(ctx, p, scale)).To(Succeed())
		scale.Spec.Replicas = 2
		Expect(k8s.SubResource("scale").Update(ctx, p, client.WithSubResourceBody(scale))).To(Succeed())
		Expect(k8s.Get(ctx, key, p)).To(Succeed())
		p.Status.IdleReplicas = 1
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())

		By("changes that move outside the rails are refused")
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.RuntimeClassName = ptr.To("runc") }),
			`spec.runtimeClassName must be "gvisor" in this namespace`)
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Image = "docker.io/library/python:3.13" }),
			`spec.image "docker.io/library/python:3.13" is not allowed`)
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("5Gi")
		}), "the sandbox memory limit is 5Gi, above this namespace's maximum of 2Gi")
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Network.Egress = append(p.Spec.Network.Egress, sandboxv1alpha1.EgressRule{CIDR: "0.0.0.0/0"})
		}), "spec.network.egress is not allowed")

		By("a pool brought within the rails stays there")
		Expect(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.RuntimeClassName = ptr.To("gvisor") })).To(Succeed())
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.RuntimeClassName = ptr.To("") }),
			`spec.runtimeClassName must be "gvisor"`)

		By("a compliant pool cannot be changed to leave the rails")
		ok := wrappers.Pool(ns, "ok").Obj()
		Expect(k8s.Create(ctx, ok)).To(Succeed())
		key = client.ObjectKeyFromObject(ok)
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.RuntimeClassName = ptr.To("") }),
			`spec.runtimeClassName must be "gvisor"`)
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Image = "docker.io/library/python:3" }),
			`spec.image "docker.io/library/python:3" is not allowed`)
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")}
		}), "the sandbox memory limit is 3Gi (no spec.resources.limits.memory")
		expectRefused(change(func(p *sandboxv1alpha1.SandboxPool) {
			p.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{{CIDR: "10.0.0.0/8"}}}
		}), "spec.network.egress is not allowed")
	})

	It("refuses every pool in enforced namespaces when its parameters are gone (fails closed)", func() {
		DeferCleanup(func() { setParams(nil); waitForShippedGuardrails(ns) })
		_, params := guardrailsManifests()
		Expect(k8s.Delete(ctx, params)).To(Succeed())
		Eventually(func() error { return dryRun(wrappers.Pool(ns, "python").Obj()) }).
			WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring("no params found")))
		// The API server answers a binding it cannot configure with 422 Invalid.
		err := k8s.Create(ctx, wrappers.Pool(ns, "python").Obj())
		Expect(err).To(MatchError(And(ContainSubstring(guardrailsPolicy), ContainSubstring("no params found"))))
		Expect(k8s.Create(ctx, wrappers.Pool(open, "python").RuntimeClass("").Obj())).To(Succeed(), "other namespaces are not affected")
	})

	It("refuses every pool in enforced namespaces when its parameters are broken", func() {
		DeferCleanup(func() { setParams(nil); waitForShippedGuardrails(ns) })
		setParams(map[string]string{"maxCPU": "two"})
		Eventually(func() error { return dryRun(wrappers.Pool(ns, "python").Obj()) }).
			WithTimeout(30 * time.Second).Should(HaveOccurred())
		expectRefused(k8s.Create(ctx, wrappers.Pool(ns, "python").Obj()),
			"the guard rails' parameters (ConfigMap warmpool-system/warmpool-guardrails) are broken")

		setParams(map[string]string{"allowedImagePrefixes": " , "})
		Eventually(func() error { return dryRun(wrappers.Pool(ns, "python").Obj()) }).
			WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring("allowedImagePrefixes must list at least one prefix")))
	})

	It("follows its parameters", func() {
		DeferCleanup(func() { setParams(nil); waitForShippedGuardrails(ns) })
		egress := wrappers.Pool(ns, "egress").Obj()
		egress.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{{CIDR: "10.0.0.0/8"}}}
		big := wrappers.Pool(ns, "big").Obj()
		big.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}
		other := wrappers.Pool(ns, "other").Image("registry.example.com/sandboxes/python:3.13").Obj()
		kata := wrappers.Pool(ns, "kata").RuntimeClass("kata").Obj()

		setParams(map[string]string{
			"allowEgress":               "true",
			"maxCPU":                    "4",
			"maxMemory":                 "8Gi",
			"allowedImagePrefixes":      "warmpool.dev/repl:, registry.example.com/sandboxes/",
			"runtimeClassName":          "kata",
			"allowedPriorityClassNames": "sandbox-low, sandbox-high",
		})
		Eventually(func() error { return dryRun(kata) }).WithTimeout(30 * time.Second).Should(Succeed())
		for _, pool := range []*sandboxv1alpha1.SandboxPool{egress, big, other} {
			pool.Spec.RuntimeClassName = ptr.To("kata")
			Expect(k8s.Create(ctx, pool)).To(Succeed(), pool.Name)
		}
		Expect(k8s.Create(ctx, kata)).To(Succeed())
		high := wrappers.Pool(ns, "high").RuntimeClass("kata").Obj()
		high.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Spec: sandboxv1alpha1.SandboxPodSpec{PriorityClassName: "sandbox-high"}}
		Expect(k8s.Create(ctx, high)).To(Succeed(), "a priority class the parameters allow")
		high.Spec.Template.Spec.PriorityClassName = "system-cluster-critical"
		high.Name, high.ResourceVersion = "critical", ""
		expectRefused(k8s.Create(ctx, high), `"system-cluster-critical" is not allowed in this namespace (guard rails): remove it or use "sandbox-low" or "sandbox-high"`)
		expectRefused(k8s.Create(ctx, wrappers.Pool(ns, "gvisor").Obj()), `spec.runtimeClassName must be "kata"`)
		expectRefused(k8s.Create(ctx, wrappers.Pool(ns, "bad").RuntimeClass("kata").Image("registry.example.com/other:1").Obj()),
			`use an image starting with "warmpool.dev/repl:" or "registry.example.com/sandboxes/"`)
	})

	It("bounds the limits the operator gives a pool that sets none", func() {
		DeferCleanup(func() { setParams(nil); waitForShippedGuardrails(ns) })
		below := func(q resource.Quantity, by string) string {
			q.Sub(resource.MustParse(by))
			return q.String()
		}
		maxCPU, maxMemory := below(sandboxpod.DefaultCPULimit, "1m"), below(sandboxpod.DefaultMemoryLimit, "1Mi")
		setParams(map[string]string{"maxCPU": maxCPU, "maxMemory": maxMemory})
		defaultCPU := fmt.Sprintf("the sandbox CPU limit is %s (no spec.resources.limits.cpu: the operator's default",
			sandboxpod.DefaultCPULimit.String())
		Eventually(func() error { return dryRun(wrappers.Pool(ns, "python").Obj()) }).
			WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(defaultCPU)))

		pool := wrappers.Pool(ns, "python").Obj()
		pool.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(maxCPU)}
		expectRefused(k8s.Create(ctx, pool), fmt.Sprintf("the sandbox memory limit is %s (no spec.resources.limits.memory: the operator's default",
			sandboxpod.DefaultMemoryLimit.String()))
		pool.Spec.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(maxMemory)
		Expect(k8s.Create(ctx, pool)).To(Succeed())
	})
})
