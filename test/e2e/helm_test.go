//go:build e2e

package e2e

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The Helm chart as a user installs it, in place of the suite's kustomize
// deployment: install, run code, upgrade with a changed value, uninstall, and
// nothing the chart made is left. The kustomize deployment comes back after
// it, for the specs that follow.
//
// What helm uninstall leaves, by decision: the objects the manager itself made
// at run time in the release's namespace (the Secrets warmpool-agent-keys and
// warmpool-data-plane-cert, the leader-election Lease manager.warmpool.dev).
// Helm deletes what it rendered only; deleting the namespace removes them, and
// a later install reuses them as it finds them.
var _ = Describe("the Helm chart", Serial, Ordered, Label("helm"), func() {
	const release, releaseNS = "warmpool", "warmpool-system"
	chart := repoRoot() + "/charts/warmpool"
	repository, tag := splitImage(managerImage)
	imageValues := []string{"--set", "manager.image.repository=" + repository, "--set", "manager.image.tag=" + tag}
	leftByDesign := map[string]bool{
		"v1/Secret/" + releaseNS + "/warmpool-agent-keys":                     true,
		"v1/Secret/" + releaseNS + "/warmpool-data-plane-cert":                true,
		"coordination.k8s.io/v1/Lease/" + releaseNS + "/manager.warmpool.dev": true,
	}

	BeforeAll(func() {
		// Registered first, so that it runs however far the specs got.
		DeferCleanup(func() {
			By("putting the kustomize deployment back")
			run(helm(), "uninstall", release, "-n", releaseNS, "--ignore-not-found", "--wait", "--timeout", "5m")
			waitNoCRDs()
			run("make", "-C", repoRoot(), "--no-print-directory", "deploy")
			restartManager(releaseNS)
			scaleManager(managerReplicas)
		})

		By("removing the kustomize deployment")
		run("make", "-C", repoRoot(), "--no-print-directory", "undeploy")
		waitNoCRDs()
		// undeploy deletes the namespace too: the release's must be made anew.
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: releaseNS}, &corev1.Namespace{}))
		}).WithTimeout(3*time.Minute).Should(BeTrue(), "namespace %s still there", releaseNS)
	})

	It("installs the previous release, and the data plane's APIService becomes available", func() {
		Expect(previousChart).To(BeADirectory(), "the previous release's chart: make images builds it (make previous-images)")
		prevRepository, prevTag := splitImage(previousManagerImage)
		run(helm(), "install", release, previousChart, "-n", releaseNS, "--create-namespace", "--wait=watcher", "--timeout", "5m",
			"--set", "manager.image.repository="+prevRepository, "--set", "manager.image.tag="+prevTag)
		d := &appsv1.Deployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "warmpool-controller-manager"}, d)).To(Succeed())
		Expect(d.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"))
		Expect(d.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", release))
		Expect(d.Status.ReadyReplicas).To(Equal(int32(1)))
		Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(previousManagerImage))
		waitAPIServiceAvailable()
	})

	It("runs code", func() {
		smoke()
	})

	It("upgrades to this release with two manager replicas under load: nothing lost, run twice or wrong, every Session on its pod; "+
		"the previous release's agents keep serving, and their pool rolls to this release's image without losing its warm count", func() {
		before := apiServiceCABundle()
		load := startUpgradeLoad()
		By("upgrading the release to this build while the load runs")
		run(helm(), append([]string{"upgrade", release, chart, "-n", releaseNS, "--set", "manager.replicas=2",
			"--wait=watcher", "--timeout", "5m"}, imageValues...)...)
		Expect(run(helm(), "status", release, "-n", releaseNS, "-o", "json")).To(ContainSubstring(`"version":2`))
		Eventually(func(g Gomega) {
			for _, name := range []string{"warmpool-controller-manager", "warmpool-data-plane"} {
				d := &appsv1.Deployment{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: name}, d)).To(Succeed())
				g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(managerImage), name)
				g.Expect(d.Status.UpdatedReplicas).To(Equal(*d.Spec.Replicas), name)
				g.Expect(d.Status.ReadyReplicas).To(Equal(*d.Spec.Replicas), name)
			}
			pods := &corev1.PodList{}
			g.Expect(k8s.List(ctx, pods, client.InNamespace(releaseNS), client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
			ready := 0
			for _, p := range pods.Items {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
						ready++
					}
				}
			}
			g.Expect(ready).To(Equal(2), "Ready manager pods")
		}).WithTimeout(3 * time.Minute).Should(Succeed())
		// The manager wrote the caBundle, not Helm: the upgrade must keep it.
		Expect(apiServiceCABundle()).To(Equal(before))
		waitAPIServiceAvailable()
		load.stopAndCheck()
		smoke()

		By("rolling the pool of the previous release's agents to this release's image")
		load.rollPreviousAgents()
	})

	It("uninstalls and leaves nothing behind", func() {
		run(helm(), "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "5m")
		waitNoCRDs()
		Eventually(func(g Gomega) {
			left := map[string]bool{}
			for _, kind := range leftoverKinds {
				list := &unstructured.UnstructuredList{}
				list.SetGroupVersionKind(kind.GroupVersion().WithKind(kind.Kind + "List"))
				g.Expect(k8s.List(ctx, list)).To(Succeed())
				for _, o := range list.Items {
					labels := o.GetLabels()
					helmMade := labels["app.kubernetes.io/instance"] == release || (labels["owner"] == "helm" && labels["name"] == release)
					named := strings.HasPrefix(o.GetName(), "warmpool-") || strings.HasSuffix(o.GetName(), ".warmpool.dev") || o.GetName() == "gvisor"
					if !helmMade && !(named && (o.GetNamespace() == "" || o.GetNamespace() == releaseNS)) {
						continue
					}
					k := o.GetAPIVersion() + "/" + o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
					g.Expect(leftByDesign[k] && !helmMade).To(BeTrue(), "%s is left", k)
					left[k] = true
				}
			}
			GinkgoWriter.Printf("left in %s by design (the manager's, not Helm's): %v\n", releaseNS, left)
		}).WithTimeout(2 * time.Minute).Should(Succeed())
	})
})

// leftoverKinds are what the chart makes and what the manager makes for
// itself; uninstall must leave none of the chart's. (Sandbox pods, their
// NetworkPolicies and PodDisruptionBudgets belong to pools, which went with
// the CRDs.)
var leftoverKinds = []schema.GroupVersionKind{
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
	{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"},
	{Group: "node.k8s.io", Version: "v1", Kind: "RuntimeClass"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicy"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicyBinding"},
	{Version: "v1", Kind: "ServiceAccount"},
	{Version: "v1", Kind: "Service"},
	{Version: "v1", Kind: "Secret"},
	{Version: "v1", Kind: "ConfigMap"},
	{Version: "v1", Kind: "Pod"},
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Kind: "ReplicaSet"},
	{Group: "discovery.k8s.io", Version: "v1", Kind: "EndpointSlice"},
	{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"},
}

// smoke is the smallest proof the operator works: a pool of one warm pod and
// an Execution of print(1).
func smoke() {
	GinkgoHelper()
	ns := newNamespace()
	warmPool(wrappers.Pool(ns, "python").Replicas(1))
	ex := execute(wrappers.Execution(ns, "one").Pool("python").Code("print(1)").Obj())
	Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
	Expect(ex.Status.Stdout).To(Equal("1\n"))
}

// waitNoCRDs waits until no CRD of sandbox.warmpool.dev is left: deleting a
// CRD deletes its objects first, and a CRD being deleted cannot be applied.
func waitNoCRDs() {
	GinkgoHelper()
	Eventually(func(g Gomega) []string {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinitionList"})
		g.Expect(k8s.List(ctx, list)).To(Succeed())
		var names []string
		for _, o := range list.Items {
			if strings.HasSuffix(o.GetName(), "."+sandboxv1alpha1.GroupVersion.Group) {
				names = append(names, o.GetName())
			}
		}
		return names
	}).WithTimeout(3 * time.Minute).Should(BeEmpty())
}

func apiService() *unstructured.Unstructured {
	GinkgoHelper()
	as := &unstructured.Unstructured{}
	as.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
	Expect(k8s.Get(ctx, client.ObjectKey{Name: "v1alpha1.data.warmpool.dev"}, as)).To(Succeed())
	return as
}

func apiServiceCABundle() string {
	GinkgoHelper()
	ca, _, _ := unstructured.NestedString(apiService().Object, "spec", "caBundle")
	Expect(ca).NotTo(BeEmpty(), "the manager has not written the APIService's caBundle")
	return ca
}

// waitAPIServiceAvailable waits until kube-apiserver reaches the data plane
// through the APIService, with the CA the manager wrote into it.
func waitAPIServiceAvailable() {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		conds, _, _ := unstructured.NestedSlice(apiService().Object, "status", "conditions")
		available := false
		for _, c := range conds {
			c, _ := c.(map[string]any)
			if c["type"] == "Available" && c["status"] == "True" {
				available = true
			}
		}
		g.Expect(available).To(BeTrue(), "conditions %v", conds)
	}).WithTimeout(2 * time.Minute).Should(Succeed())
}

// splitImage splits repository:tag (a digest stays with its @ in the tag:
// the chart's manager.image.tag takes sha256:... too).
func splitImage(image string) (repository, tag string) {
	if i := strings.LastIndex(image, "@"); i >= 0 {
		return image[:i], image[i+1:]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i], image[i+1:]
	}
	return image, "latest"
}
