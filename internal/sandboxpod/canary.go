package sandboxpod

import (
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// EgressCanary is the address a sandbox dials to learn that its pool's
// NetworkPolicy is enforced before it reports ready (internal/agent/isolation):
// the API server's Service, which the manager reads from its own environment
// (KUBERNETES_SERVICE_HOST and _PORT) when it runs in a cluster. Empty (a
// manager outside a cluster, envtest) turns the check off.
var EgressCanary string

// canaryFor returns the canary address for the pool's pods, or "" when the
// pool's egress allows it (the dial would succeed for good).
func canaryFor(pool *sandboxv1alpha1.SandboxPool) string {
	host, portStr, err := net.SplitHostPort(EgressCanary)
	if err != nil {
		return ""
	}
	ip := net.ParseIP(host)
	port, err := strconv.Atoi(portStr)
	if ip == nil || err != nil {
		return ""
	}
	if n := pool.Spec.Network; n != nil {
		for _, r := range n.Egress {
			_, cidr, err := net.ParseCIDR(r.CIDR)
			if err != nil || !cidr.Contains(ip) {
				continue
			}
			if len(r.Ports) == 0 {
				return ""
			}
			for _, p := range r.Ports {
				if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
					continue
				}
				end := p.Port
				if p.EndPort != nil {
					end = *p.EndPort
				}
				if int32(port) >= p.Port && int32(port) <= end {
					return ""
				}
			}
		}
	}
	return EgressCanary
}
