package sandboxpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// A pool's pods are spread over nodes unless the pool says otherwise, and
// the spread is the pool's own: its pods, not another pool's, set the skew.
func TestPodsAreSpreadOverNodesByDefault(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	pool.Namespace, pool.Name = "ns", "python"
	pool.Spec.Image = "warmpool.dev/repl:dev"
	key := AgentKey{ID: "k1", Trusted: "k1=AAAA"}

	for spread, want := range map[sandboxv1alpha1.NodeSpread]corev1.UnsatisfiableConstraintAction{
		"":                                  corev1.ScheduleAnyway, // a pool read before the CRD defaulted it
		sandboxv1alpha1.NodeSpreadPreferred: corev1.ScheduleAnyway,
		sandboxv1alpha1.NodeSpreadRequired:  corev1.DoNotSchedule,
	} {
		pool.Spec.NodeSpread = spread
		got := New(pool, key).Spec.TopologySpreadConstraints
		if len(got) != 1 {
			t.Fatalf("nodeSpread %q: want one constraint, got %+v", spread, got)
		}
		c := got[0]
		if c.TopologyKey != corev1.LabelHostname || c.MaxSkew != 1 || c.WhenUnsatisfiable != want {
			t.Errorf("nodeSpread %q: want maxSkew 1 over %s, %s; got %+v", spread, corev1.LabelHostname, want, c)
		}
		if c.LabelSelector == nil || len(c.LabelSelector.MatchLabels) != 1 || c.LabelSelector.MatchLabels[LabelPool] != "python" {
			t.Errorf("nodeSpread %q: the skew must count this pool's pods alone, got selector %+v", spread, c.LabelSelector)
		}
		if c.NodeTaintsPolicy == nil || *c.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor {
			t.Errorf("nodeSpread %q: nodes whose taints the pod does not tolerate must not count, got %v", spread, c.NodeTaintsPolicy)
		}
	}

	pool.Spec.NodeSpread = sandboxv1alpha1.NodeSpreadNone
	if got := New(pool, key).Spec.TopologySpreadConstraints; got != nil {
		t.Errorf("nodeSpread None: want no constraint, got %+v", got)
	}

	own := corev1.TopologySpreadConstraint{MaxSkew: 2, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule}
	pool.Spec.NodeSpread = sandboxv1alpha1.NodeSpreadRequired
	pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Spec: sandboxv1alpha1.SandboxPodSpec{
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{own}}}
	if got := New(pool, key).Spec.TopologySpreadConstraints; len(got) != 1 || got[0].TopologyKey != corev1.LabelTopologyZone {
		t.Errorf("the template's own constraints are used as they are, got %+v", got)
	}
}

// Changing the spread places new pods differently and moves none: it is not
// part of the template a rollout replaces pods for.
func TestNodeSpreadRollsNoPod(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	pool.Spec.Image = "warmpool.dev/repl:dev"
	before := TemplateHash(pool)
	pool.Spec.NodeSpread = sandboxv1alpha1.NodeSpreadNone
	if TemplateHash(pool) != before {
		t.Fatal("nodeSpread changed the template hash: every pod would be replaced")
	}
}
