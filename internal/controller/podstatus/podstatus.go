// Package podstatus reads why a sandbox pod ended or cannot start, as
// reasons a user can act on (the Execution's, the Session's and the pool's
// conditions name them).
package podstatus

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// End returns why the kubelet or the kernel ended the sandbox (OOMKilled,
// Evicted), or "" for any other end (deleted, node lost).
func End(pod *corev1.Pod) (reason, msg string) {
	if pod == nil {
		return "", ""
	}
	if pod.Status.Reason == "Evicted" {
		return sandboxv1alpha1.ReasonEvicted, fmt.Sprintf("the kubelet evicted pod %s: %s", pod.Name, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != sandboxpod.ContainerName {
			continue
		}
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if t != nil && t.Reason == "OOMKilled" {
				var limit resource.Quantity
				for _, c := range pod.Spec.Containers {
					if c.Name == sandboxpod.ContainerName {
						limit = c.Resources.Limits[corev1.ResourceMemory]
					}
				}
				return sandboxv1alpha1.ReasonOOMKilled, fmt.Sprintf("the kernel killed the sandbox container of pod %s for using "+
					"more than its memory limit of %s, past the budget the agent keeps the code in: raise the pool's "+
					"spec.limits.memoryReserve (room for the agent and the runtime) or its memory limit", pod.Name, limit.String())
			}
		}
	}
	return "", ""
}

// Trouble returns a reason a user can act on when the pod cannot start.
func Trouble(p *corev1.Pod) (reason, message string) {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ImagePullBackOff", "ErrImagePull", "InvalidImageName":
				return sandboxv1alpha1.ReasonImagePullBackOff, fmt.Sprintf("%s: %s", w.Reason, w.Message)
			case "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return sandboxv1alpha1.ReasonCrashLoopBackOff, fmt.Sprintf("%s: %s", w.Reason, w.Message)
			}
		}
	}
	if p.Status.Phase == corev1.PodFailed && lease.ClaimedBy(p) == "" {
		return "PodFailed", fmt.Sprintf("failed before it ran code: %s %s", p.Status.Reason, p.Status.Message)
	}
	return "", ""
}

// Unschedulable returns the scheduler's words when it could not place the
// pod (PodScheduled False, reason Unschedulable: no node has the CPU or
// memory it requests, or none matches its selector or tolerates its
// taints), else "".
func Unschedulable(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return ""
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}
