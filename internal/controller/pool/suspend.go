package pool

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// setSuspendCondition says, on a pool that asks for its Sessions to be
// suspended (sessionSuspendAfter), whether the manager can: without a
// snapshot store it cannot, and the Sessions keep their pods until their
// idle timeout.
func setSuspendCondition(st *sandboxv1alpha1.SandboxPoolStatus, pool *sandboxv1alpha1.SandboxPool, store string) {
	if pool.Spec.SessionSuspendAfter == nil {
		meta.RemoveStatusCondition(&st.Conditions, sandboxv1alpha1.PoolConditionSessionSuspend)
		return
	}
	c := metav1.Condition{Type: sandboxv1alpha1.PoolConditionSessionSuspend, ObservedGeneration: pool.Generation,
		Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.ReasonSnapshotStoreConfigured,
		Message: fmt.Sprintf("Sessions idle for %s are suspended to %s and resumed by their next run", pool.Spec.SessionSuspendAfter.Duration, store)}
	if store == "" {
		c.Status, c.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonNoSnapshotStore
		c.Message = "suspend is off: the manager has no snapshot store (the Helm chart's snapshots.store values, or the manager's " +
			"--snapshot-store-* flags), so Sessions keep their pods until their idle timeout"
	}
	if pool.Spec.SessionIdleTimeout != nil && pool.Spec.SessionSuspendAfter.Duration >= pool.Spec.SessionIdleTimeout.Duration && store != "" {
		c.Status, c.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonSuspendAfterIdleTimeout
		c.Message = fmt.Sprintf("sessionSuspendAfter %s is not shorter than sessionIdleTimeout %s: Sessions close before they would be suspended",
			pool.Spec.SessionSuspendAfter.Duration, pool.Spec.SessionIdleTimeout.Duration)
	}
	meta.SetStatusCondition(&st.Conditions, c)
}
