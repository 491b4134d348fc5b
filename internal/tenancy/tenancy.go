// Package tenancy decides who may use a pool: its own namespace always, and
// other namespaces only through a shared pool (spec.sharing) that the
// platform put in a namespace the manager shares pools from, whose
// namespaceSelector picks them. It also gives each tenant namespace its
// weight and limits on a shared pool.
//
// Why the namespace of a shared pool must be one the manager is told about:
// whoever may exec into, read or create pods in that namespace can read every
// tenant's code and data. A tenant who could mark a pool of its own namespace
// shared, and have others point at it, would be that someone.
package tenancy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// DefaultSharedNamespaces is where the manager shares pools from unless told
// otherwise: a namespace only cluster administrators create.
var DefaultSharedNamespaces = []string{"warmpool-shared"}

// Namespaces is the set of namespaces the manager shares pools from.
type Namespaces []string

// ParseNamespaces reads a comma-separated list ("" for none).
func ParseNamespaces(s string) Namespaces {
	var out Namespaces
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// Shares reports whether pools of namespace ns may be shared.
func (n Namespaces) Shares(ns string) bool { return slices.Contains(n, ns) }

// Shared reports whether pool serves other namespaces: it asks to, from a
// namespace the manager shares pools from.
func (n Namespaces) Shared(pool *sandboxv1alpha1.SandboxPool) bool {
	return pool != nil && pool.Spec.Sharing != nil && n.Shares(pool.Namespace)
}

// Refusal says why a namespace may not use a pool: a condition reason and a
// message that says what to do.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// Labels reads a namespace's labels (the manager's cached client).
type Labels func(ctx context.Context, ns string) (map[string]string, error)

// FromClient reads namespaces' labels with c.
func FromClient(c client.Reader) Labels {
	return func(ctx context.Context, ns string) (map[string]string, error) {
		obj := &corev1.Namespace{}
		if err := c.Get(ctx, types.NamespacedName{Name: ns}, obj); err != nil {
			return nil, fmt.Errorf("read namespace %s: %w", ns, err)
		}
		return obj.Labels, nil
	}
}

// Admit returns nil when objects of namespace ns may use pool, a *Refusal
// when they may not, and another error when ns's labels cannot be read.
func (n Namespaces) Admit(ctx context.Context, nsLabels Labels, pool *sandboxv1alpha1.SandboxPool, ns string) error {
	if ns == pool.Namespace {
		return nil
	}
	if pool.Spec.Sharing == nil {
		return &Refusal{sandboxv1alpha1.ReasonPoolNotShared, fmt.Sprintf(
			"SandboxPool %s/%s is not shared (no spec.sharing): use a pool of namespace %s, or ask the platform team to share this one",
			pool.Namespace, pool.Name, ns)}
	}
	if !n.Shares(pool.Namespace) {
		return &Refusal{sandboxv1alpha1.ReasonPoolNotShared, fmt.Sprintf(
			"SandboxPool %s/%s asks to be shared, but the manager shares pools only from namespaces %v (--shared-pool-namespaces)",
			pool.Namespace, pool.Name, []string(n))}
	}
	sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.Sharing.NamespaceSelector)
	if err != nil {
		return &Refusal{sandboxv1alpha1.ReasonNamespaceNotAdmitted, fmt.Sprintf(
			"SandboxPool %s/%s: spec.sharing.namespaceSelector: %v", pool.Namespace, pool.Name, err)}
	}
	l, err := nsLabels(ctx, ns)
	if err != nil {
		return err
	}
	if !sel.Matches(labels.Set(l)) {
		return &Refusal{sandboxv1alpha1.ReasonNamespaceNotAdmitted, fmt.Sprintf(
			"the shared SandboxPool %s/%s does not admit namespace %s: its namespaceSelector (%s) does not match the namespace's labels",
			pool.Namespace, pool.Name, ns, sel.String())}
	}
	return nil
}

// Policy is one tenant's share of a pool.
type Policy struct {
	Weight                           int32
	MaxPods, MaxSessions, MaxWaiting int32 // -1: no limit
}

// Unlimited is the policy of a pool's own namespace, and of every tenant of
// a pool that sets no limits.
var Unlimited = Policy{Weight: 1, MaxPods: -1, MaxSessions: -1, MaxWaiting: -1}

// ReservedIdle is the idle pods a shared pool keeps for namespaces that hold
// none of its pods: the dispatcher gives them to no one else, and the pool
// keeps at least that many idle whatever its replicas say (a reserve that
// exists only when the pool happens to be large enough protects no one).
func ReservedIdle(pool *sandboxv1alpha1.SandboxPool) int {
	if pool == nil || pool.Spec.Sharing == nil {
		return 0
	}
	return int(pool.Spec.Sharing.ReservedIdlePods)
}

// PolicyFor returns namespace ns's weight and limits on pool. A pool's own
// namespace is not limited by its sharing.
func PolicyFor(pool *sandboxv1alpha1.SandboxPool, ns string) Policy {
	if pool == nil || pool.Spec.Sharing == nil || ns == pool.Namespace {
		return Unlimited
	}
	sh := pool.Spec.Sharing
	out := Unlimited
	apply := func(l sandboxv1alpha1.TenantLimits) {
		if l.MaxPods != nil {
			out.MaxPods = *l.MaxPods
		}
		if l.MaxSessions != nil {
			out.MaxSessions = *l.MaxSessions
		}
		if l.MaxWaiting != nil {
			out.MaxWaiting = *l.MaxWaiting
		}
	}
	apply(sh.Limits)
	for _, t := range sh.Tenants {
		if t.Namespace == ns {
			if t.Weight > 0 {
				out.Weight = t.Weight
			}
			apply(t.Limits)
		}
	}
	return out
}

// Gate is the manager's tenancy rule: the namespaces it shares pools from and
// how it reads a namespace's labels.
type Gate struct {
	Namespaces Namespaces
	Labels     Labels
}

// Admit is Namespaces.Admit with the gate's labels.
func (g *Gate) Admit(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, ns string) error {
	if g == nil { // no gate: no pool is shared
		return Namespaces(nil).Admit(ctx, nil, pool, ns)
	}
	return g.Namespaces.Admit(ctx, g.Labels, pool, ns)
}

// Admitted reports whether ns may use pool; a namespace whose labels cannot
// be read is not.
func (g *Gate) Admitted(pool *sandboxv1alpha1.SandboxPool, ns string) bool {
	// The dispatcher asks under its lock: never wait long for a cache.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return g.Admit(ctx, pool, ns) == nil
}
