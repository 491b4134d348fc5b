package nodes

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func node(name string, mod func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "sandboxes", corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:     []corev1.ContainerImage{{Names: []string{"a-large-image-list"}}},
		},
	}
	if mod != nil {
		mod(n)
	}
	return n
}

func TestExcludesWhatThePoolMayNotUse(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Spec: sandboxv1alpha1.SandboxPodSpec{
		NodeSelector: map[string]string{"pool": "sandboxes"},
		Tolerations:  []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists}},
	}}
	for _, tc := range []struct {
		name string
		mod  func(*corev1.Node)
		why  string // "" : not excluded
	}{
		{"a Ready node that matches", nil, ""},
		{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, "is cordoned"},
		{"not Ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, "is not Ready"},
		{"no Ready condition yet", func(n *corev1.Node) { n.Status.Conditions = nil }, "is not Ready"},
		{"tainted NoSchedule by an autoscaler about to remove it", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}}
		}, "has the taint ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule, which the pool does not tolerate"},
		{"tainted NoExecute", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "karpenter.sh/disrupted", Effect: corev1.TaintEffectNoExecute}}
		}, "karpenter.sh/disrupted:NoExecute"},
		{"a taint the pool tolerates", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "sandbox", Value: "only", Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"a PreferNoSchedule taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "busy", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, ""},
		{"relabelled out of the pool's nodeSelector", func(n *corev1.Node) { n.Labels["pool"] = "batch" }, "does not match the pool's nodeSelector"},
	} {
		tr := New()
		tr.Update(node("n1", tc.mod))
		got := tr.Excludes(pool, "n1")
		if tc.why == "" && got != "" || tc.why != "" && !strings.Contains(got, tc.why) {
			t.Errorf("%s: want %q, got %q", tc.name, tc.why, got)
		}
	}
}

func TestExcludesFollowsTheNodeAndThePool(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	tr := New()
	if got := tr.Excludes(pool, "unknown"); got != "" {
		t.Errorf("a node not heard of is not judged, got %q", got)
	}
	if got := tr.Excludes(pool, ""); got != "" {
		t.Errorf("a pod not scheduled yet is not judged, got %q", got)
	}
	if !tr.Update(node("n1", nil)) {
		t.Error("a new node is a change")
	}
	if tr.Update(node("n1", func(n *corev1.Node) { n.Status.Images = nil })) {
		t.Error("a change placement does not look at (its images) must not make every pod on it be judged again")
	}
	if !tr.Update(node("n1", func(n *corev1.Node) { n.Spec.Unschedulable = true })) || tr.Excludes(pool, "n1") == "" {
		t.Error("a cordon is a change, and excludes the node")
	}
	if !tr.Update(node("n1", nil)) || tr.Excludes(pool, "n1") != "" {
		t.Error("an uncordon is a change, and gives the node back")
	}
	// A pool whose selector changed excludes the nodes its pods are on.
	pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Spec: sandboxv1alpha1.SandboxPodSpec{
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"gpu"}}}}}}}},
	}}
	if got := tr.Excludes(pool, "n1"); !strings.Contains(got, "required node affinity") {
		t.Errorf("want the affinity named, got %q", got)
	}
	tr.Delete("n1")
	if got := tr.Excludes(pool, "n1"); got != "" {
		t.Errorf("a deleted node is forgotten, got %q", got)
	}
}

func TestTrimKeepsWhatPlacementReads(t *testing.T) {
	n := node("n1", func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse})
	})
	out, _ := Trim(n)
	got := out.(*corev1.Node)
	if len(got.Status.Images) != 0 || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != corev1.NodeReady ||
		len(got.Spec.Taints) != 1 || got.Labels["pool"] != "sandboxes" {
		t.Fatalf("trimmed: %+v", got)
	}
}

func TestDrainsWhatIsBeingEmptied(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*corev1.Node)
		why  string
	}{
		{"a Ready node", nil, ""},
		{"cordoned (kubectl drain)", func(n *corev1.Node) { n.Spec.Unschedulable = true }, "is cordoned"},
		{"cluster-autoscaler removes it", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}
		}, "ToBeDeletedByClusterAutoscaler"},
		{"Karpenter disrupts it", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "karpenter.sh/disrupted", Effect: corev1.TaintEffectNoSchedule}}
		}, "karpenter.sh/disrupted"},
		{"a NoExecute taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "maintenance", Effect: corev1.TaintEffectNoExecute}}
		}, "maintenance:NoExecute"},
		{"another NoSchedule taint keeps new pods off, moves nothing", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"unreachable is lost, not drained", func(n *corev1.Node) {
			n.Status.Conditions[0].Status = corev1.ConditionUnknown
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		}, ""},
	} {
		tr := New()
		tr.Update(node("n1", tc.mod))
		got := tr.Drains("n1")
		if tc.why == "" && got != "" || tc.why != "" && !strings.Contains(got, tc.why) {
			t.Errorf("%s: want %q, got %q", tc.name, tc.why, got)
		}
	}
	if New().Drains("unknown") != "" {
		t.Error("a node not heard of is not drained")
	}
}

func TestLostIsAKubeletThatStoppedAnswering(t *testing.T) {
	since := metav1.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		mod  func(*corev1.Node)
		why  string
	}{
		{"a Ready node", nil, ""},
		{"Ready Unknown (the node controller's mark)", func(n *corev1.Node) {
			n.Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
				LastTransitionTime: since, Message: "Kubelet stopped posting node status."}
		}, "node n1 stopped answering at 2026-12-07T10:00:00Z (Kubelet stopped posting node status.)"},
		{"tainted unreachable", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		}, "node.kubernetes.io/unreachable:NoExecute"},
		{"a kubelet that answers Not Ready is not lost", func(n *corev1.Node) {
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}, ""},
		{"cordoned is drained, not lost", func(n *corev1.Node) { n.Spec.Unschedulable = true }, ""},
	} {
		tr := New()
		tr.Update(node("n1", tc.mod))
		got := tr.Lost("n1")
		if tc.why == "" && got != "" || tc.why != "" && !strings.Contains(got, tc.why) {
			t.Errorf("%s: want %q, got %q", tc.name, tc.why, got)
		}
	}
	if New().Lost("unknown") != "" {
		t.Error("a node not heard of is not lost")
	}
	// Unknown after False is a change the pods must be judged again for.
	tr := New()
	tr.Update(node("n1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }))
	if !tr.Update(node("n1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })) {
		t.Error("Not Ready to Unknown was not reported as a change")
	}
}
