package sandboxpod

import (
	"math"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// DisruptionBudget keeps voluntary evictions (kubectl drain, cluster
// autoscaler and Karpenter consolidation) away from busy pods: evicting one
// would kill running code or a session's state. Idle pods stay evictable: the
// pool replaces them. A drain waits until the busy pods are done (an Execution
// deletes its pod when it ends; a session's pod lives until the session's idle
// timeout). Pods that are not Ready may always be evicted, so a wedged pod
// never blocks a drain.
//
// The budget is an integer minAvailable no pool can reach, not
// maxUnavailable: 0. With maxUnavailable (or any percentage) the disruption
// controller takes the expected pod count from the owner's scale subresource,
// which is the pool's warm replicas; busy pods are extra, so with more busy
// pods than warm replicas it allowed the surplus to be evicted. An integer
// minAvailable counts only the selected pods: disruptionsAllowed stays 0.
func DisruptionBudget(pool *sandboxv1alpha1.SandboxPool) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: pool.Name, Labels: map[string]string{LabelPool: pool.Name}},
		Spec: policyv1.PodDisruptionBudgetSpec{
			Selector:                   &metav1.LabelSelector{MatchLabels: map[string]string{LabelPool: pool.Name, LabelState: StateBusy}},
			MinAvailable:               ptr.To(intstr.FromInt32(math.MaxInt32)),
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
}
