package sandboxpod

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func TestEgressCanaryUnlessThePoolAllowsIt(t *testing.T) {
	defer func(old string) { EgressCanary = old }(EgressCanary)
	EgressCanary = "10.96.0.1:443"
	rule := func(cidr string, ports ...sandboxv1alpha1.EgressPort) sandboxv1alpha1.EgressRule {
		return sandboxv1alpha1.EgressRule{CIDR: cidr, Ports: ports}
	}
	cases := []struct {
		name   string
		egress []sandboxv1alpha1.EgressRule
		want   bool
	}{
		{"no egress", nil, true},
		{"other networks", []sandboxv1alpha1.EgressRule{rule("203.0.113.0/24")}, true},
		{"its network, another port", []sandboxv1alpha1.EgressRule{rule("10.96.0.0/12", sandboxv1alpha1.EgressPort{Port: 80})}, true},
		{"its network, UDP", []sandboxv1alpha1.EgressRule{rule("0.0.0.0/0", sandboxv1alpha1.EgressPort{Port: 443, Protocol: corev1.ProtocolUDP})}, true},
		{"everything on 443", []sandboxv1alpha1.EgressRule{rule("0.0.0.0/0", sandboxv1alpha1.EgressPort{Port: 443})}, false},
		{"a range with 443", []sandboxv1alpha1.EgressRule{rule("10.96.0.1/32", sandboxv1alpha1.EgressPort{Port: 400, EndPort: ptr.To[int32](500)})}, false},
		{"every port of its network", []sandboxv1alpha1.EgressRule{rule("10.96.0.0/12")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := &sandboxv1alpha1.SandboxPool{}
			pool.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: tc.egress}
			args := New(pool, AgentKey{}).Spec.Containers[0].Args
			if got := slices.Contains(args, "--egress-canary"); got != tc.want {
				t.Fatalf("--egress-canary in args = %v, want %v (%v)", got, tc.want, args)
			}
		})
	}
	EgressCanary = ""
	if slices.Contains(New(&sandboxv1alpha1.SandboxPool{}, AgentKey{}).Spec.Containers[0].Args, "--egress-canary") {
		t.Fatal("a manager outside a cluster names no canary")
	}
}
