package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// ensureIsolation keeps the pool's NetworkPolicy and PodDisruptionBudget as
// sandboxpod builds them: created when missing (also after someone deleted
// them), put back when edited. Both are owned by the pool and go with it.
func (r *Reconciler) ensureIsolation(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) error {
	np := sandboxpod.NetworkPolicy(pool, r.ManagerNamespace)
	npErr := r.ensureOwned(ctx, pool, "NetworkPolicy", np,
		syncSpec(np, func(o *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicySpec { return &o.Spec }))
	if npErr != nil {
		npErr = fmt.Errorf("network policy of pool %s: %w", pool.Name, npErr)
	}
	pdb := sandboxpod.DisruptionBudget(pool)
	pdbErr := r.ensureOwned(ctx, pool, "PodDisruptionBudget", pdb,
		syncSpec(pdb, func(o *policyv1.PodDisruptionBudget) *policyv1.PodDisruptionBudgetSpec { return &o.Spec }))
	if pdbErr != nil {
		pdbErr = fmt.Errorf("disruption budget of pool %s: %w", pool.Name, pdbErr)
	}
	return errors.Join(npErr, pdbErr)
}

// syncSpec returns the update for ensureOwned that puts want's spec and pool
// label back on the existing object.
func syncSpec[T client.Object, S any](want T, spec func(T) *S) func(client.Object) bool {
	return func(existing client.Object) bool {
		cur := existing.(T)
		if equality.Semantic.DeepEqual(*spec(cur), *spec(want)) &&
			cur.GetLabels()[sandboxpod.LabelPool] == want.GetLabels()[sandboxpod.LabelPool] {
			return false
		}
		*spec(cur) = *spec(want)
		cur.SetLabels(want.GetLabels())
		return true
	}
}

// ensureOwned creates want, owned by the pool, or brings the existing object
// back to it (update reports whether it changed anything).
func (r *Reconciler) ensureOwned(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, kind string, want client.Object,
	update func(existing client.Object) bool) error {
	existing := want.DeepCopyObject().(client.Object)
	err := r.Get(ctx, client.ObjectKeyFromObject(want), existing)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	if err != nil {
		if err := controllerutil.SetControllerReference(pool, want, r.Scheme()); err != nil {
			return err
		}
		err := r.Create(ctx, want)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		// The cache holds only objects labelled as a pool's: read the one in the way.
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), existing); err != nil {
			return err
		}
	}
	if !metav1.IsControlledBy(existing, pool) {
		// Someone else's object of the same name: never take it over silently.
		return fmt.Errorf("%s %s exists and is not owned by the pool: delete or rename it", kind, want.GetName())
	}
	if !update(existing) {
		return nil
	}
	return r.Update(ctx, existing)
}

// reopeningPolicies names the other NetworkPolicies of the pool's namespace
// that select its pods and allow them traffic, sorted.
func (r *Reconciler) reopeningPolicies(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) ([]string, error) {
	var list networkingv1.NetworkPolicyList
	if err := r.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("list network policies of namespace %s: %w", pool.Namespace, err)
	}
	var names []string
	for i := range list.Items {
		np := &list.Items[i]
		if !metav1.IsControlledBy(np, pool) && sandboxpod.ReopensPool(np, pool) {
			names = append(names, np.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// setPolicyCondition says whether the pool's NetworkPolicy is in place, and
// which other policies open its pods to more than it allows.
func setPolicyCondition(st *sandboxv1alpha1.SandboxPoolStatus, pool *sandboxv1alpha1.SandboxPool, others []string, err error) {
	c := metav1.Condition{Type: sandboxv1alpha1.PoolConditionNetworkPolicyReady, ObservedGeneration: pool.Generation,
		Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.ReasonPolicyApplied,
		Message: fmt.Sprintf("NetworkPolicy %s allows ingress to the agent port from the manager only, and %s; "+
			"it isolates the pods only if the cluster's network plugin enforces NetworkPolicies", pool.Name, egressSummary(pool))}
	switch {
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, sandboxv1alpha1.ReasonPolicyFailed, err.Error()
	case len(others) > 0:
		c.Reason = sandboxv1alpha1.ReasonOtherPoliciesApply
		c.Message = fmt.Sprintf("NetworkPolicy %s is in place, but NetworkPolicies %s of this namespace also select the pool's pods "+
			"and allow them traffic; policies add up, so that traffic is allowed too: narrow their podSelector "+
			"to exclude label %s if the sandboxes should not have it", pool.Name, strings.Join(others, ", "), sandboxpod.LabelPool)
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

func egressSummary(pool *sandboxv1alpha1.SandboxPool) string {
	if pool.Spec.Network == nil || len(pool.Spec.Network.Egress) == 0 {
		return "no egress (DNS included)"
	}
	return fmt.Sprintf("egress to the %d destinations of spec.network.egress only", len(pool.Spec.Network.Egress))
}
