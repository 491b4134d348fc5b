package sandboxpod_test

import (
	"math"
	"reflect"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func TestNetworkPolicyDeniesAllButTheManagerByDefault(t *testing.T) {
	pool := wrappers.Pool("ns", "p").Obj()
	np := sandboxpod.NetworkPolicy(pool, "warmpool-system")
	if got := np.Spec.PodSelector.MatchLabels; !reflect.DeepEqual(got, map[string]string{sandboxpod.LabelPool: "p"}) {
		t.Errorf("selects %v", got)
	}
	if len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("policy types %v: want Ingress and Egress", np.Spec.PolicyTypes)
	}
	if np.Spec.Egress == nil || len(np.Spec.Egress) != 0 {
		t.Errorf("egress %v: want an empty list (deny all, DNS included)", np.Spec.Egress)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 1 {
		t.Fatalf("ingress %+v: want one rule, one peer, one port", np.Spec.Ingress)
	}
	from, port := np.Spec.Ingress[0].From[0], np.Spec.Ingress[0].Ports[0]
	if from.NamespaceSelector == nil || from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "warmpool-system" ||
		from.PodSelector == nil || from.PodSelector.MatchLabels[sandboxpod.LabelAgentClient] != "true" || from.IPBlock != nil {
		t.Errorf("ingress peer %+v: want the manager's namespace and its agent-client pods only", from)
	}
	if port.Port.IntValue() != sandboxpod.AgentPort || *port.Protocol != "TCP" {
		t.Errorf("ingress port %v", port)
	}
}

func TestNetworkPolicyEgressAllowlistNeverReachesMetadata(t *testing.T) {
	pool := wrappers.Pool("ns", "p").Obj()
	pool.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{
		{CIDR: "0.0.0.0/0"},
		{CIDR: "::/0", Ports: []sandboxv1alpha1.EgressPort{{Port: 443}}},
		{CIDR: "203.0.113.0/24", Ports: []sandboxv1alpha1.EgressPort{{Protocol: "UDP", Port: 53}, {Port: 8000, EndPort: ptr.To[int32](8010)}}},
		{CIDR: "169.254.169.254/32"}, // refused by the API; must not widen the policy if it slips through
		{CIDR: "100.100.100.200/32"},
		{CIDR: "10.1.2.3/24"},
		{CIDR: "not-a-cidr"},
	}}
	eg := sandboxpod.NetworkPolicy(pool, "m").Spec.Egress
	if len(eg) != 3 {
		t.Fatalf("%d egress rules, want 3 (the invalid and metadata ones dropped): %+v", len(eg), eg)
	}
	want := []networkingv1.IPBlock{
		{CIDR: "0.0.0.0/0", Except: []string{"169.254.0.0/16", "100.100.100.200/32"}},
		{CIDR: "::/0", Except: []string{"fe80::/10", "fd00:ec2::254/128"}},
		{CIDR: "203.0.113.0/24"},
	}
	for i, w := range want {
		if got := eg[i].To[0].IPBlock; !reflect.DeepEqual(*got, w) {
			t.Errorf("rule %d: %+v, want %+v", i, *got, w)
		}
	}
	if len(eg[0].Ports) != 0 {
		t.Errorf("a rule without ports must allow every port: %+v", eg[0].Ports)
	}
	if p := eg[1].Ports; len(p) != 1 || *p[0].Protocol != "TCP" || p[0].Port.IntValue() != 443 {
		t.Errorf("default protocol: %+v", p)
	}
	if p := eg[2].Ports; len(p) != 2 || *p[0].Protocol != "UDP" || *p[1].EndPort != 8010 {
		t.Errorf("ports: %+v", p)
	}
}

func TestDisruptionBudgetCoversBusyPodsOnly(t *testing.T) {
	pdb := sandboxpod.DisruptionBudget(wrappers.Pool("ns", "p").Obj())
	if got := pdb.Spec.Selector.MatchLabels; !reflect.DeepEqual(got, map[string]string{sandboxpod.LabelPool: "p", sandboxpod.LabelState: sandboxpod.StateBusy}) {
		t.Errorf("selects %v", got)
	}
	if pdb.Spec.MaxUnavailable != nil || pdb.Spec.MinAvailable.IntValue() != math.MaxInt32 {
		t.Errorf("budget %+v", pdb.Spec)
	}
}

func TestReopensPoolFindsPoliciesThatAllowTrafficToThePoolsPods(t *testing.T) {
	pool := wrappers.Pool("ns", "p").Obj()
	pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Metadata: sandboxv1alpha1.SandboxPodMetadata{
		Labels: map[string]string{"team": "a"}}}
	allowAll := []networkingv1.NetworkPolicyIngressRule{{}}
	np := func(ns string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule,
		out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel},
				PolicyTypes: types, Ingress: in, Egress: out}}
	}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	for _, tc := range []struct {
		name string
		np   *networkingv1.NetworkPolicy
		want bool
	}{
		{"every pod of the namespace, ingress from anywhere", np("ns", nil, nil, allowAll, nil), true},
		{"by a template label", np("ns", map[string]string{"team": "a"}, nil, allowAll, nil), true},
		{"busy pods only", np("ns", map[string]string{sandboxpod.LabelState: sandboxpod.StateBusy}, nil, allowAll, nil), true},
		{"egress rules, types defaulted", np("ns", nil, nil, nil, []networkingv1.NetworkPolicyEgressRule{{}}), true},
		{"egress rules, explicit type", np("ns", nil, egress, nil, []networkingv1.NetworkPolicyEgressRule{{}}), true},
		{"another namespace", np("other", nil, nil, allowAll, nil), false},
		{"other pods", np("ns", map[string]string{"app": "web"}, nil, allowAll, nil), false},
		{"another pool", np("ns", map[string]string{sandboxpod.LabelPool: "q"}, nil, allowAll, nil), false},
		{"deny only", np("ns", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, nil, nil), false},
		{"ingress rules that the types switch off", np("ns", nil, egress, allowAll, nil), false},
	} {
		if got := sandboxpod.ReopensPool(tc.np, pool); got != tc.want {
			t.Errorf("%s: ReopensPool = %v, want %v", tc.name, got, tc.want)
		}
	}
}
