package kubectlplugin

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
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

// NODES: the most loaded nodes first, pods not placed yet as <pending>, the
// rest counted; ended and deleted pods, and other pools' pods, not at all.
func TestNodesColumn(t *testing.T) {
	var objs []client.Object
	add := func(ns, pool, name, node string, mod func(*corev1.Pod)) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{sandboxpod.LabelPool: pool}},
			Spec: corev1.PodSpec{NodeName: node}}
		if mod != nil {
			mod(p)
		}
		objs = append(objs, p)
	}
	for i, node := range []string{"a", "a", "a", "c", "c", "b", "d", "e", ""} {
		add("ns", "python", fmt.Sprintf("p%d", i), node, nil)
	}
	add("ns", "python", "ended", "z", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })
	add("ns", "other", "o1", "z", nil)
	add("elsewhere", "python", "x1", "z", nil)
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	pools := []sandboxv1alpha1.SandboxPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "python"}}}
	got, err := podsPerNode(context.Background(), c, false, pools)
	if err != nil {
		t.Fatal(err)
	}
	if want := "a=3,c=2,<pending>=1,b=1,+2"; got[types.NamespacedName{Namespace: "ns", Name: "python"}] != want {
		t.Errorf("want %q, got %q", want, got[types.NamespacedName{Namespace: "ns", Name: "python"}])
	}
	if want := "z=1"; got[types.NamespacedName{Namespace: "ns", Name: "other"}] != want {
		t.Errorf("another pool's pods are its own: want %q, got %q", want, got[types.NamespacedName{Namespace: "ns", Name: "other"}])
	}
	if _, ok := got[types.NamespacedName{Namespace: "elsewhere", Name: "python"}]; ok {
		t.Error("without -A, another namespace's pods are not listed")
	}
}
