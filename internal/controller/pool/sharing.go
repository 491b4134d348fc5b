package pool

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/tenancy"
)

// maxTenantsReported bounds status.tenants and the tenant series of a pool.
const maxTenantsReported = 100

// setSharing says, on a pool that sets spec.sharing, whether other
// namespaces may use it, and what each tenant holds and waits for (usage,
// from the dispatcher, those holding most first).
func setSharing(st *sandboxv1alpha1.SandboxPoolStatus, pool *sandboxv1alpha1.SandboxPool, shares tenancy.Namespaces,
	usage []sandboxv1alpha1.TenantUsage) {
	if pool.Spec.Sharing == nil {
		meta.RemoveStatusCondition(&st.Conditions, sandboxv1alpha1.PoolConditionShared)
		st.Tenants = nil
		return
	}
	c := metav1.Condition{Type: sandboxv1alpha1.PoolConditionShared, ObservedGeneration: pool.Generation}
	if shares.Shares(pool.Namespace) {
		sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.Sharing.NamespaceSelector)
		who := "every namespace"
		switch {
		case err != nil:
			who = "no namespace (" + err.Error() + ")"
		case !sel.Empty():
			who = "namespaces labelled " + sel.String()
		}
		c.Status, c.Reason = metav1.ConditionTrue, sandboxv1alpha1.ReasonSharing
		c.Message = fmt.Sprintf("shared with %s; %d use it now", who, len(usage))
	} else {
		c.Status, c.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonSharingNotAllowed
		c.Message = fmt.Sprintf("the manager shares pools only from namespaces [%s] (--shared-pool-namespaces, the Helm value "+
			"sharedPools.namespaces): move the pool there, or have the platform team add namespace %s",
			strings.Join(shares, ", "), pool.Namespace)
	}
	meta.SetStatusCondition(&st.Conditions, c)
	st.Tenants = usage[:min(len(usage), maxTenantsReported)]
}

// recordTenants sets the tenant series of a shared pool from its status.
func recordTenants(pool *sandboxv1alpha1.SandboxPool, st *sandboxv1alpha1.SandboxPoolStatus) {
	metrics.PoolTenant.DeletePartialMatch(prometheus.Labels{"namespace": pool.Namespace, "pool": pool.Name})
	for _, t := range st.Tenants {
		metrics.PoolTenant.WithLabelValues(pool.Namespace, pool.Name, t.Namespace, "held").Set(float64(t.Pods))
		metrics.PoolTenant.WithLabelValues(pool.Namespace, pool.Name, t.Namespace, "sessions").Set(float64(t.Sessions))
		metrics.PoolTenant.WithLabelValues(pool.Namespace, pool.Name, t.Namespace, "waiting").Set(float64(t.Waiting))
	}
}
