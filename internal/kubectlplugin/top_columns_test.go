package kubectlplugin

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// ROLLOUT and AGENTS as a pool mid-rollout, stalled or done shows them.
func TestRolloutAndAgentColumns(t *testing.T) {
	pool := func(reason, message string) *sandboxv1alpha1.SandboxPool {
		p := &sandboxv1alpha1.SandboxPool{}
		p.Status.Replicas, p.Status.UpdatedReplicas = 5, 3
		if reason != "" {
			p.Status.Conditions = []metav1.Condition{{Type: sandboxv1alpha1.PoolConditionProgressing, Reason: reason, Message: message}}
		}
		return p
	}
	for _, c := range []struct {
		reason, column, stalled string
	}{
		{"", "-", ""},
		{sandboxv1alpha1.ReasonRollingOut, "3/5", ""},
		{sandboxv1alpha1.ReasonRolloutComplete, "done", ""},
		{sandboxv1alpha1.ReasonRolloutStalled, "stalled", "why"},
	} {
		col, stalled := rollout(pool(c.reason, "why"))
		if col != c.column || stalled != c.stalled {
			t.Errorf("%q: %q %q, want %q %q", c.reason, col, stalled, c.column, c.stalled)
		}
	}
	got := agents([]sandboxv1alpha1.AgentVersionCount{{Build: "v0.3.0", Protocol: 1, Replicas: 4, Supported: true},
		{Build: "v9.0.0", Protocol: 2, Replicas: 1}})
	if got != "v0.3.0x4,v9.0.0x1!" {
		t.Errorf("agents %q", got)
	}
	if agents(nil) != "-" {
		t.Errorf("no agents: %q", agents(nil))
	}
}
