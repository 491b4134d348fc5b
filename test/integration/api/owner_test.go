package api_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const ownerPolicy = "ValidatingAdmissionPolicy 'warmpool-owner'"

// The owner policy (config/admission), as `make deploy` applies it, with two
// editors of one namespace: alice and mallory.
var _ = Describe("Owner of Sessions and Executions (config/admission)", func() {
	var ns string
	var alice, mallory client.Client

	BeforeEach(func() {
		for _, obj := range kustomizeBuild("config/admission") {
			applyObject(obj)
		}
		applyTenantRoles()
		ns = newNamespace()
		bindRoles(ns, "alice", tenantRoles["edit"]...)
		bindRoles(ns, "mallory", tenantRoles["edit"]...)
		alice, mallory = clientAs("alice"), clientAs("mallory")
		// The policy reaches admission through an informer.
		Eventually(func(g Gomega) {
			err := mallory.Create(ctx, wrappers.Session(ns, "probe").Owner("alice").Obj(), client.DryRunAll)
			g.Expect(err).To(MatchError(ContainSubstring(ownerPolicy)))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("refuses a Session or an Execution whose owner is not the user creating it", func() {
		err := mallory.Create(ctx, wrappers.Session(ns, "forged").Owner("alice").OwnerOnly().Obj())
		expectForbidden(err, "mallory creates a Session owned by alice")
		Expect(err.Error()).To(ContainSubstring("spec.owner must be the user creating the Session (mallory)"))

		err = mallory.Create(ctx, wrappers.Execution(ns, "forged").Code("1").Session("s").Owner("alice").Obj())
		expectForbidden(err, "mallory creates an Execution owned by alice")
		Expect(err.Error()).To(ContainSubstring("spec.owner must be the user creating the Execution (mallory)"))
	})

	It("records the creator, who cannot be changed afterwards by anyone", func() {
		ses := wrappers.Session(ns, "mine").Owner("alice").OwnerOnly().Obj()
		Expect(alice.Create(ctx, ses)).To(Succeed())
		Expect(alice.Create(ctx, wrappers.Execution(ns, "mine").Code("1").Session("mine").Owner("alice").Obj())).To(Succeed())
		Expect(mallory.Create(ctx, wrappers.Session(ns, "unowned").Obj())).To(Succeed(), "owner is optional")

		stored := &sandboxv1alpha1.Session{}
		Expect(alice.Get(ctx, client.ObjectKeyFromObject(ses), stored)).To(Succeed())
		Expect(stored.Spec.Owner).To(Equal("alice"))
		Expect(stored.Spec.Access).To(Equal(sandboxv1alpha1.SessionAccessOwner))

		// Another editor may edit the Session (close it), but neither take it
		// over nor open it to the namespace.
		for patch, msg := range map[string]string{
			`{"spec":{"owner":"mallory"}}`:    "spec.owner is immutable",
			`{"spec":{"owner":null}}`:         "spec is immutable",
			`{"spec":{"access":"Namespace"}}`: "spec.access is immutable",
		} {
			err := mallory.Patch(ctx, wrappers.Session(ns, "mine").Obj(), client.RawPatch(types.MergePatchType, []byte(patch)))
			Expect(err).To(HaveOccurred(), "mallory patches %s", patch)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid for %s, got %v", patch, err)
			Expect(err.Error()).To(ContainSubstring(msg))
		}
		err := mallory.Patch(ctx, wrappers.Execution(ns, "mine").Obj(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"owner":"mallory"}}`)))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "mallory takes over alice's Execution: %v", err)
		Expect(mallory.Patch(ctx, wrappers.Session(ns, "mine").Obj(),
			client.RawPatch(types.MergePatchType, []byte(`{"spec":{"close":true}}`)))).To(Succeed(), "closing stays with RBAC")
	})

	It("refuses a Session bound to nobody", func() {
		err := alice.Create(ctx, wrappers.Session(ns, "nobody").OwnerOnly().Obj())
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("spec.access Owner binds the Session to spec.owner"))
	})
})
