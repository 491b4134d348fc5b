// Package nodes says whether a pool may still hand out a pod on a node: not
// on a node that is cordoned or being drained, tainted with what the pool
// does not tolerate, no longer matching the pool's node selector or required
// affinity, or not Ready. It keeps what it needs of each node, fed by the
// node informer's events.
package nodes

import (
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Tracker is what is known of each node. Safe for concurrent use.
type Tracker struct {
	mu    sync.RWMutex
	nodes map[string]*corev1.Node
}

// New returns an empty Tracker: until it hears of a node, it excludes
// nothing on it (a manager without the right to watch nodes places pods as
// before, by the scheduler's word alone).
func New() *Tracker { return &Tracker{nodes: map[string]*corev1.Node{}} }

// Trim keeps of a node what placement looks at: a few fields of thousands of
// nodes, not their images and volumes. Usable as the informer's transform.
func Trim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, Labels: n.Labels, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
	}
	if i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }); i >= 0 {
		out.Status.Conditions = []corev1.NodeCondition{n.Status.Conditions[i]}
	}
	return out, nil
}

// Update takes in a node as the informer saw it, and reports whether
// anything placement looks at changed (the pods on it are then judged again).
func (t *Tracker) Update(n *corev1.Node) bool {
	trimmed, _ := Trim(n)
	n = trimmed.(*corev1.Node)
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.nodes[n.Name]
	t.nodes[n.Name] = n
	return old == nil || old.Spec.Unschedulable != n.Spec.Unschedulable || !equality.Semantic.DeepEqual(old.Spec.Taints, n.Spec.Taints) ||
		!equality.Semantic.DeepEqual(old.Labels, n.Labels) || readyStatus(old) != readyStatus(n)
}

// Delete forgets a node.
func (t *Tracker) Delete(name string) {
	t.mu.Lock()
	delete(t.nodes, name)
	t.mu.Unlock()
}

// Handler feeds the tracker from an informer; changed hears of each node
// whose placement may have changed.
func (t *Tracker) Handler(changed func(node string)) toolscache.ResourceEventHandler {
	update := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && t.Update(n) && changed != nil {
			changed(n.Name)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { update(obj) },
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				t.Delete(n.Name)
				if changed != nil {
					changed(n.Name)
				}
			}
		},
	}
}

// Excludes says why pool may not hand out a pod on node ("" when it may).
// A pod not scheduled yet (node "") and a node not heard of are not judged.
func (t *Tracker) Excludes(pool *sandboxv1alpha1.SandboxPool, node string) string {
	n := t.get(node)
	if n == nil {
		return ""
	}
	return excludes(pool, n)
}

// get returns what is known of node; nil for a node not heard of (or a pod
// not scheduled yet, node "").
func (t *Tracker) get(node string) *corev1.Node {
	if t == nil || node == "" {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.nodes[node]
}

// drainTaints are the NoSchedule taints of tools that empty a node before
// removing it (cluster-autoscaler, Karpenter) and of a cordon.
var drainTaints = []string{"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption",
	corev1.TaintNodeUnschedulable}

// Drains says why node is being emptied ("" when it is not): cordoned (a
// kubectl drain's first step), tainted by a tool that removes nodes, or
// tainted NoExecute (which evicts every pod that does not tolerate it).
// The Sessions on it move to other nodes. A node that stopped answering
// is not drained: it is lost (its pods cannot be asked for their state).
func (t *Tracker) Drains(node string) string {
	n := t.get(node)
	if n == nil {
		return ""
	}
	if n.Spec.Unschedulable {
		return fmt.Sprintf("node %s is cordoned", n.Name)
	}
	for i := range n.Spec.Taints {
		taint := &n.Spec.Taints[i]
		if taint.Effect == corev1.TaintEffectNoExecute && taint.Key != corev1.TaintNodeNotReady && taint.Key != corev1.TaintNodeUnreachable ||
			taint.Effect == corev1.TaintEffectNoSchedule && slices.Contains(drainTaints, taint.Key) {
			return fmt.Sprintf("node %s has the taint %s", n.Name, taint.ToString())
		}
	}
	return ""
}

// Lost says why node's pods are given up for lost ("" when they are not):
// the node controller marked its kubelet silent (Ready Unknown, set after
// its node-monitor grace period), or tainted it unreachable. Its pods can
// neither be asked what they ran nor stopped: what ran on them is reported
// lost, never run again by itself. A kubelet that answers and says its node
// is not Ready (Ready False) is not lost: its pods may still run, and their
// own state decides.
func (t *Tracker) Lost(node string) string {
	n := t.get(node)
	if n == nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
			msg := fmt.Sprintf("node %s stopped answering", n.Name)
			if !c.LastTransitionTime.IsZero() {
				msg += " at " + c.LastTransitionTime.UTC().Format(time.RFC3339)
			}
			if c.Message != "" {
				msg += " (" + c.Message + ")"
			}
			return msg
		}
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == corev1.TaintNodeUnreachable {
			return fmt.Sprintf("node %s stopped answering (taint %s)", n.Name, n.Spec.Taints[i].ToString())
		}
	}
	return ""
}

func excludes(pool *sandboxv1alpha1.SandboxPool, n *corev1.Node) string {
	if n.Spec.Unschedulable {
		return fmt.Sprintf("node %s is cordoned (being drained, or kept from new pods)", n.Name)
	}
	if !ready(n) {
		return fmt.Sprintf("node %s is not Ready", n.Name)
	}
	var spec sandboxv1alpha1.SandboxPodSpec
	if pool.Spec.Template != nil {
		spec = pool.Spec.Template.Spec
	}
	for i := range n.Spec.Taints {
		taint := &n.Spec.Taints[i]
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), taint, false) }) {
			return fmt.Sprintf("node %s has the taint %s, which the pool does not tolerate", n.Name, taint.ToString())
		}
	}
	if ok, err := nodeaffinity.NewRequiredNodeAffinity(spec.NodeSelector, spec.Affinity).Match(n); err != nil || !ok {
		return fmt.Sprintf("node %s does not match the pool's nodeSelector or required node affinity any more", n.Name)
	}
	return ""
}

// ready reports whether the node's kubelet says it is Ready. A node with no
// Ready condition yet (just registered) is not.
func ready(n *corev1.Node) bool { return readyStatus(n) == corev1.ConditionTrue }

// readyStatus is the status of the node's Ready condition ("" without one):
// False (the kubelet says so) and Unknown (the kubelet went silent: Lost)
// are told apart.
func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}
