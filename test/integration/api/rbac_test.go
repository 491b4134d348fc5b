package api_test

import (
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The ClusterRoles for the people who use warmpool, as `make deploy` names
// them (config/default adds the warmpool- prefix), by the built-in role they
// aggregate into.
var tenantRoles = map[string][]string{
	"admin": {"warmpool-sandboxpool-admin-role", "warmpool-execution-admin-role"},
	"edit":  {"warmpool-sandboxpool-editor-role", "warmpool-execution-editor-role", "warmpool-session-editor-role"},
	"view":  {"warmpool-sandboxpool-viewer-role", "warmpool-execution-viewer-role", "warmpool-session-viewer-role"},
}

// deployedTenantRoles renders config/default and returns the tenant roles, by name.
func deployedTenantRoles() map[string]*rbacv1.ClusterRole {
	GinkgoHelper()
	wanted := map[string]bool{}
	for _, names := range tenantRoles {
		for _, n := range names {
			wanted[n] = true
		}
	}
	roles := map[string]*rbacv1.ClusterRole{}
	for _, obj := range kustomizeBuild("config/default") {
		if obj.GetKind() != "ClusterRole" || !wanted[obj.GetName()] {
			continue
		}
		role := &rbacv1.ClusterRole{}
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, role)).To(Succeed())
		roles[role.Name] = role
	}
	Expect(roles).To(HaveLen(len(wanted)), "config/default must ship every tenant ClusterRole")
	return roles
}

// applyTenantRoles installs the tenant roles as `make deploy` does.
func applyTenantRoles() {
	GinkgoHelper()
	for _, role := range deployedTenantRoles() {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(role)
		Expect(err).NotTo(HaveOccurred())
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion(rbacv1.SchemeGroupVersion.String())
		u.SetKind("ClusterRole")
		Expect(k8s.Patch(ctx, u, client.Apply, client.FieldOwner("warmpool-test"), client.ForceOwnership)).To(Succeed())
	}
}

// bindRoles gives user the ClusterRoles in namespace ns with RoleBindings.
func bindRoles(ns, user string, roles ...string) {
	GinkgoHelper()
	for _, role := range roles {
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		})).To(Succeed())
	}
}

// clientAs is a client acting as user.
func clientAs(user string) client.Client {
	GinkgoHelper()
	c, err := env.ClientAs(user)
	Expect(err).NotTo(HaveOccurred())
	return c
}

func expectForbidden(err error, what string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "%s: the API server allowed it", what)
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: want 403 Forbidden, got %v", what, err)
}

// cancel sets spec.cancel as `kubectl patch --type merge` does.
func cancel(c client.Client, ns, name string) error {
	ex := &sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return c.Patch(ctx, ex, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`)))
}

var _ = Describe("Tenant RBAC", func() {
	It("labels the tenant roles so the built-in admin, edit and view roles aggregate them", func() {
		roles := deployedTenantRoles()
		// selects reports whether the built-in role, as the API server's RBAC
		// bootstrap created it, aggregates the tenant role.
		selects := func(builtin, name string) bool {
			GinkgoHelper()
			r := &rbacv1.ClusterRole{}
			Expect(k8s.Get(ctx, client.ObjectKey{Name: builtin}, r)).To(Succeed())
			Expect(r.AggregationRule).NotTo(BeNil(), "built-in %s aggregates", builtin)
			for _, sel := range r.AggregationRule.ClusterRoleSelectors {
				s, err := metav1.LabelSelectorAsSelector(&sel)
				Expect(err).NotTo(HaveOccurred())
				if s.Matches(labels.Set(roles[name].Labels)) {
					return true
				}
			}
			return false
		}
		for builtin, names := range tenantRoles {
			for _, name := range names {
				Expect(roles[name].Labels).To(HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-"+builtin, "true"), name)
				Expect(selects(builtin, name)).To(BeTrue(), "%s must be aggregated into %s", name, builtin)
				// A role reaches the wider built-in roles through the built-in
				// chain (view into edit into admin), never the narrower ones.
				switch builtin {
				case "admin":
					Expect(selects("edit", name)).To(BeFalse(), "%s must not reach edit", name)
					Expect(selects("view", name)).To(BeFalse(), "%s must not reach view", name)
				case "edit":
					Expect(selects("view", name)).To(BeFalse(), "%s must not reach view", name)
				}
			}
		}
	})

	It("grants tenants nothing on status, Secrets or other API groups, and viewers only reads", func() {
		for name, role := range deployedTenantRoles() {
			viewer := strings.HasSuffix(name, "-viewer-role")
			for _, rule := range role.Rules {
				if name == "warmpool-session-editor-role" && slices.Equal(rule.APIGroups, []string{"data.warmpool.dev"}) {
					// The data plane's verbs: running code in a Session is editing.
					for _, res := range rule.Resources {
						Expect(res).To(Or(HavePrefix("sessions/"), Equal("runs/exec")), name)
					}
					continue
				}
				Expect(rule.APIGroups).To(Equal([]string{sandboxv1alpha1.GroupVersion.Group}), name)
				Expect(rule.NonResourceURLs).To(BeEmpty(), name)
				Expect(rule.ResourceNames).To(BeEmpty(), name)
				for _, res := range rule.Resources {
					Expect(res).NotTo(ContainSubstring("*"), "%s: wildcard resources would include status", name)
					Expect(res).NotTo(ContainSubstring("secrets"), name)
					if strings.HasSuffix(res, "/status") {
						Expect(rule.Verbs).To(Equal([]string{"get"}), "%s: only the manager writes %s", name, res)
					}
					if viewer {
						for _, v := range rule.Verbs {
							Expect([]string{"get", "list", "watch"}).To(ContainElement(v), "%s: %s on %s", name, v, res)
						}
					}
				}
			}
		}
	})

	Describe("on the API server, with tenants in namespaces A and B", func() {
		var nsA, nsB string
		var alice, bob, carol, nobody client.Client

		BeforeEach(func() {
			applyTenantRoles()
			nsA, nsB = newNamespace(), newNamespace()
			// What `kubectl create rolebinding --clusterrole=edit` gives once the
			// cluster's aggregation controller ran: envtest has no controller
			// manager, so the built-in roles stay empty here and the tenant
			// roles are bound directly (the labels are checked above).
			bindRoles(nsA, "alice", append(tenantRoles["edit"], tenantRoles["view"]...)...)
			bindRoles(nsA, "bob", tenantRoles["view"]...)
			bindRoles(nsA, "carol", append(append(tenantRoles["admin"], tenantRoles["edit"]...), tenantRoles["view"]...)...)
			// B is another tenant's, with a pool and an Execution of its own.
			bindRoles(nsB, "mallory", append(tenantRoles["edit"], tenantRoles["view"]...)...)
			Expect(k8s.Create(ctx, wrappers.Pool(nsB, "python").Obj())).To(Succeed())
			Expect(k8s.Create(ctx, wrappers.Execution(nsB, "theirs").Obj())).To(Succeed())
			alice, bob, carol, nobody = clientAs("alice"), clientAs("bob"), clientAs("carol"), clientAs("nobody")
			// RoleBindings reach the authorizer through its informers.
			Eventually(func() error {
				return alice.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsA))
			}).Should(Succeed())
			Eventually(func() error {
				return bob.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsA))
			}).Should(Succeed())
			Eventually(func() error {
				return carol.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsA))
			}).Should(Succeed())
		})

		It("forbids a user without bindings everything (RBAC is on, so the cases below mean something)", func() {
			expectForbidden(nobody.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsA)), "nobody lists Executions")
			expectForbidden(nobody.Create(ctx, wrappers.Execution(nsA, "x").Obj()), "nobody creates an Execution")
			expectForbidden(nobody.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "python"}, &sandboxv1alpha1.SandboxPool{}), "nobody gets a pool")
		})

		It("lets an editor run, cancel and delete Executions and manage and scale pools in their namespace", func() {
			pool := wrappers.Pool(nsA, "python").Obj()
			Expect(alice.Create(ctx, pool)).To(Succeed())
			ex := wrappers.Execution(nsA, "mine").Obj()
			Expect(alice.Create(ctx, ex)).To(Succeed())
			Expect(alice.Get(ctx, client.ObjectKeyFromObject(ex), &sandboxv1alpha1.Execution{})).To(Succeed())
			Expect(alice.List(ctx, &sandboxv1alpha1.SandboxPoolList{}, client.InNamespace(nsA))).To(Succeed())
			Expect(cancel(alice, nsA, "mine")).To(Succeed())
			Expect(alice.SubResource("status").Get(ctx, ex, &sandboxv1alpha1.Execution{})).To(Succeed(), "editors read status")

			scale := &autoscalingv1.Scale{}
			Expect(alice.SubResource("scale").Get(ctx, pool, scale)).To(Succeed())
			scale.Spec.Replicas = 3
			Expect(alice.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))).To(Succeed())

			Expect(alice.Delete(ctx, ex)).To(Succeed())
			Expect(alice.Delete(ctx, pool)).To(Succeed())
		})

		It("keeps an editor of A away from B's Executions and pools", func() {
			theirs := &sandboxv1alpha1.Execution{}
			expectForbidden(alice.Create(ctx, wrappers.Execution(nsB, "intrude").Obj()), "create an Execution in B")
			expectForbidden(alice.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "theirs"}, theirs), "get B's Execution")
			expectForbidden(alice.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsB)), "list B's Executions")
			expectForbidden(cancel(alice, nsB, "theirs"), "cancel B's Execution")
			expectForbidden(alice.Delete(ctx, wrappers.Execution(nsB, "theirs").Obj()), "delete B's Execution")
			expectForbidden(alice.List(ctx, &sandboxv1alpha1.ExecutionList{}), "list Executions of all namespaces")

			pool := wrappers.Pool(nsB, "python").Obj()
			expectForbidden(alice.Get(ctx, client.ObjectKeyFromObject(pool), &sandboxv1alpha1.SandboxPool{}), "get B's pool")
			expectForbidden(alice.List(ctx, &sandboxv1alpha1.SandboxPoolList{}, client.InNamespace(nsB)), "list B's pools")
			expectForbidden(alice.Create(ctx, wrappers.Pool(nsB, "mine").Obj()), "create a pool in B")
			expectForbidden(alice.Delete(ctx, pool), "delete B's pool")
			expectForbidden(alice.SubResource("scale").Get(ctx, pool, &autoscalingv1.Scale{}), "read B's pool's scale")

			// Nothing changed in B.
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "theirs"}, theirs)).To(Succeed())
			Expect(theirs.Spec.Cancel).To(BeFalse())
		})

		It("lets nobody but the manager write status, not even a namespace admin", func() {
			pool := wrappers.Pool(nsA, "python").Obj()
			Expect(alice.Create(ctx, pool)).To(Succeed())
			ex := wrappers.Execution(nsA, "mine").Obj()
			Expect(alice.Create(ctx, ex)).To(Succeed())

			forged := ex.DeepCopy()
			forged.Status.Phase = sandboxv1alpha1.PhaseSucceeded
			forged.Status.Stdout = "forged"
			poolForged := pool.DeepCopy()
			poolForged.Status.IdleReplicas = 100
			for user, c := range map[string]client.Client{"editor": alice, "admin": carol, "viewer": bob} {
				expectForbidden(c.Status().Update(ctx, forged.DeepCopy()), user+" updates an Execution's status")
				expectForbidden(c.Status().Patch(ctx, forged.DeepCopy(), client.MergeFrom(ex)), user+" patches an Execution's status")
				expectForbidden(c.Status().Update(ctx, poolForged.DeepCopy()), user+" updates a pool's status")
			}
			got := &sandboxv1alpha1.Execution{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
			Expect(got.Status.Phase).To(BeEmpty())
		})

		It("lets a viewer read their namespace and change nothing", func() {
			Expect(k8s.Create(ctx, wrappers.Pool(nsA, "python").Obj())).To(Succeed())
			Expect(k8s.Create(ctx, wrappers.Execution(nsA, "ex").Obj())).To(Succeed())
			pool := wrappers.Pool(nsA, "python").Obj()
			Expect(bob.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "ex"}, &sandboxv1alpha1.Execution{})).To(Succeed())
			Expect(bob.List(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(nsA))).To(Succeed())
			Expect(bob.Get(ctx, client.ObjectKeyFromObject(pool), &sandboxv1alpha1.SandboxPool{})).To(Succeed())
			Expect(bob.List(ctx, &sandboxv1alpha1.SandboxPoolList{}, client.InNamespace(nsA))).To(Succeed())
			scale := &autoscalingv1.Scale{}
			Expect(bob.SubResource("scale").Get(ctx, pool, scale)).To(Succeed())

			expectForbidden(bob.Create(ctx, wrappers.Execution(nsA, "mine").Obj()), "viewer creates an Execution")
			expectForbidden(cancel(bob, nsA, "ex"), "viewer cancels an Execution")
			expectForbidden(bob.Delete(ctx, wrappers.Execution(nsA, "ex").Obj()), "viewer deletes an Execution")
			expectForbidden(bob.Create(ctx, wrappers.Pool(nsA, "mine").Obj()), "viewer creates a pool")
			scale.Spec.Replicas = 5
			expectForbidden(bob.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)), "viewer scales a pool")
			expectForbidden(bob.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "any"}, &corev1.Secret{}), "viewer reads a Secret")
			expectForbidden(bob.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "theirs"}, &sandboxv1alpha1.Execution{}), "viewer reads B")
		})

		It("lets an Execution name a pool of another namespace only as a reference the manager judges", func() {
			By("the CRD's poolRef has a name and a namespace, and keeps no unknown fields")
			crd := &unstructured.Unstructured{}
			crd.SetAPIVersion("apiextensions.k8s.io/v1")
			crd.SetKind("CustomResourceDefinition")
			Expect(k8s.Get(ctx, client.ObjectKey{Name: "executions.sandbox.warmpool.dev"}, crd)).To(Succeed())
			versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
			Expect(versions).NotTo(BeEmpty())
			for _, v := range versions {
				schema := v.(map[string]any)["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
				spec, _, _ := unstructured.NestedMap(schema, "properties", "spec")
				poolRef, found, _ := unstructured.NestedMap(spec, "properties", "poolRef")
				Expect(found).To(BeTrue())
				props, _, _ := unstructured.NestedMap(poolRef, "properties")
				keys := make([]string, 0, len(props))
				for k := range props {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				// A namespace names a shared pool; the manager serves the reference
				// only when that pool shares with this namespace (envtest sharedpool_test.go).
				Expect(keys).To(Equal([]string{"name", "namespace"}))
				for _, s := range []map[string]any{schema, spec, poolRef} {
					Expect(s).NotTo(HaveKey("x-kubernetes-preserve-unknown-fields"))
				}
			}

			By("a poolRef naming B is stored as written, immutable; one naming no namespace is refused")
			manifest := `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: Execution
metadata:
  name: cross
spec:
  poolRef: {name: python, namespace: ` + nsB + `}
  code: print(1)
`
			Expect(alice.Create(ctx, fromYAML(nsA, manifest), client.FieldValidation("Strict"))).To(Succeed())
			stored := &sandboxv1alpha1.Execution{}
			Expect(alice.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "cross"}, stored)).To(Succeed())
			Expect(stored.Spec.PoolRef).To(Equal(sandboxv1alpha1.PoolReference{Name: "python", Namespace: nsB}))
			stored.Spec.PoolRef.Namespace = nsA
			Expect(alice.Update(ctx, stored)).To(MatchError(ContainSubstring("spec.poolRef is immutable")))

			bad := strings.Replace(manifest, "namespace: "+nsB, "namespace: Not_A-Namespace", 1)
			bad = strings.Replace(bad, "name: cross", "name: bad", 1)
			Expect(alice.Create(ctx, fromYAML(nsA, bad))).To(MatchError(ContainSubstring("poolRef.namespace must be a namespace name")))
		})
	})
})
