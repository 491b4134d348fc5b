package pool

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// A pool that asks for suspend says whether it gets it: on with a store,
// off and why without one, and off when Sessions would close first.
func TestSuspendConditionSaysWhetherSessionsAreSuspended(t *testing.T) {
	pool := func(after, idle time.Duration) *sandboxv1alpha1.SandboxPool {
		p := &sandboxv1alpha1.SandboxPool{}
		if after > 0 {
			p.Spec.SessionSuspendAfter = &metav1.Duration{Duration: after}
		}
		if idle > 0 {
			p.Spec.SessionIdleTimeout = &metav1.Duration{Duration: idle}
		}
		return p
	}
	for _, c := range []struct {
		name          string
		pool          *sandboxv1alpha1.SandboxPool
		store         string
		status        metav1.ConditionStatus
		reason, words string
	}{
		{"suspend asked, store configured", pool(time.Minute, 10*time.Minute), "s3://b/ at s3:9000", metav1.ConditionTrue,
			sandboxv1alpha1.ReasonSnapshotStoreConfigured, "s3://b/ at s3:9000"},
		{"suspend asked, no store", pool(time.Minute, 0), "", metav1.ConditionFalse,
			sandboxv1alpha1.ReasonNoSnapshotStore, "--snapshot-store-"},
		{"suspend after the idle timeout", pool(time.Hour, time.Minute), "s3://b/ at s3:9000", metav1.ConditionFalse,
			sandboxv1alpha1.ReasonSuspendAfterIdleTimeout, "close before"},
	} {
		st := &sandboxv1alpha1.SandboxPoolStatus{}
		setSuspendCondition(st, c.pool, c.store)
		got := meta.FindStatusCondition(st.Conditions, sandboxv1alpha1.PoolConditionSessionSuspend)
		if got == nil || got.Status != c.status || got.Reason != c.reason || !strings.Contains(got.Message, c.words) {
			t.Errorf("%s: %+v, want %s %s saying %q", c.name, got, c.status, c.reason, c.words)
		}
	}
	// A pool that does not ask has no such condition, whatever it had.
	st := &sandboxv1alpha1.SandboxPoolStatus{}
	setSuspendCondition(st, pool(time.Minute, 0), "")
	setSuspendCondition(st, pool(0, 0), "")
	if meta.FindStatusCondition(st.Conditions, sandboxv1alpha1.PoolConditionSessionSuspend) != nil {
		t.Error("a pool that does not ask for suspend keeps the condition")
	}
}
