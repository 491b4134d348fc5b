package sandboxpod

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// neverReachable are cut out of every egress CIDR a pool allows: link-local
// networks (where clouds serve instance metadata and credentials) and the
// metadata addresses that live elsewhere (Alibaba Cloud's, AWS's IPv6 one).
var neverReachable = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// NetworkPolicy is the policy that isolates the pool's pods: ingress only to
// the agent port and only from pods labelled LabelAgentClient in
// managerNamespace; egress only to what spec.network.egress lists, DNS
// included. NetworkPolicies are additive: any other policy that selects these
// pods can open more, which is why the platform should watch for them.
func NetworkPolicy(pool *sandboxv1alpha1.SandboxPool, managerNamespace string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: pool.Name, Labels: map[string]string{LabelPool: pool.Name}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelPool: pool.Name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
						"kubernetes.io/metadata.name": managerNamespace}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelAgentClient: "true"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{
					Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(AgentPort)),
				}},
			}},
			// Empty, not nil: with PolicyTypes Egress it denies all egress.
			Egress: []networkingv1.NetworkPolicyEgressRule{},
		},
	}
	if pool.Spec.Network == nil {
		return np
	}
	for _, rule := range pool.Spec.Network.Egress {
		block, ok := ipBlock(rule.CIDR)
		if !ok {
			continue // the API refuses these; never widen the policy for one that slipped through
		}
		er := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{IPBlock: block}}}
		for _, p := range rule.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			er.Ports = append(er.Ports, networkingv1.NetworkPolicyPort{
				Protocol: ptr.To(proto), Port: ptr.To(intstr.FromInt32(p.Port)), EndPort: p.EndPort,
			})
		}
		np.Spec.Egress = append(np.Spec.Egress, er)
	}
	return np
}

// ipBlock returns the block for an allowed CIDR with the never-reachable
// networks inside it cut out, and false for a CIDR that is invalid or lies
// within one of them.
func ipBlock(cidr string) (*networkingv1.IPBlock, bool) {
	allowed, err := netip.ParsePrefix(cidr)
	if err != nil || allowed != allowed.Masked() {
		return nil, false
	}
	block := &networkingv1.IPBlock{CIDR: allowed.String()}
	for _, never := range neverReachable {
		switch {
		case never.Addr().Is4() != allowed.Addr().Is4():
		case never.Bits() <= allowed.Bits() && never.Contains(allowed.Addr()):
			return nil, false
		case allowed.Contains(never.Addr()):
			block.Except = append(block.Except, never.String())
		}
	}
	return block, true
}

// ReopensPool reports whether np, another policy than the pool's own, selects
// some pod of the pool (in any state) and allows it traffic. NetworkPolicies
// add up: whatever such a policy allows is allowed, whatever the pool's own
// policy says. A policy with no rules only denies, which changes nothing here.
func ReopensPool(np *networkingv1.NetworkPolicy, pool *sandboxv1alpha1.SandboxPool) bool {
	if np.Namespace != pool.Namespace || !allowsSomething(np) {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		return false // the API server refuses such selectors; nothing to match
	}
	for _, state := range []string{StateIdle, StateBusy, StateResetting} {
		podLabels := map[string]string{}
		if pool.Spec.Template != nil {
			for k, v := range pool.Spec.Template.Metadata.Labels {
				podLabels[k] = v
			}
		}
		podLabels[LabelPool] = pool.Name
		podLabels[LabelState] = state
		if sel.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}

func allowsSomething(np *networkingv1.NetworkPolicy) bool {
	types := np.Spec.PolicyTypes
	if len(types) == 0 {
		// The API's default: Ingress always, Egress when there are egress rules.
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	for _, t := range types {
		if (t == networkingv1.PolicyTypeIngress && len(np.Spec.Ingress) > 0) ||
			(t == networkingv1.PolicyTypeEgress && len(np.Spec.Egress) > 0) {
			return true
		}
	}
	return false
}
