package pool

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentcheck"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The rollout policy: when a pool's template changes (image, preload, env,
// resources, the agent key...), its warm pods are replaced the way a
// Deployment surges. Pods of the new template start next to the old ones;
// an old idle pod keeps serving claims (after the new ones) until enough
// new pods are Ready to take its place, so the warm count never drops for a
// rollout. At spec.maxPods there is no room to surge: an old idle pod makes
// room for a new one, one at a time, and only while the new ones start. A
// new template whose pods fail to start (a preload that does not import,
// an image that does not pull, an agent the manager cannot call) stalls the
// rollout: the old pods keep serving and Progressing says why. Busy pods
// (Executions, Sessions) finish on the template they started on.

// rollout is where a pool's pods stand between its templates.
type rollout struct {
	updated, old, oldBusy int32
	// stalled says why the new template's pods do not start ("" if they do).
	stalled string
}

func (r *Reconciler) rolloutOf(pool *sandboxv1alpha1.SandboxPool, pods poolPods, startFailure string) rollout {
	hash := sandboxpod.TemplateHash(pool)
	ro := rollout{
		updated: int32(len(pods.idle) + len(pods.warming)),
		old:     int32(len(pods.staleIdle) + len(pods.staleWarm)),
		stalled: startFailure,
	}
	for _, p := range pods.busy {
		if p.Labels[sandboxpod.LabelTemplateHash] != hash {
			ro.oldBusy++
		}
	}
	if ro.stalled == "" {
		for _, p := range pods.warming {
			if reason, msg := podstatus.Trouble(p); reason != "" {
				ro.stalled = fmt.Sprintf("pod %s: %s: %s", p.Name, reason, msg)
				break
			}
		}
	}
	return ro
}

// mayEvictForRoom reports whether an old idle pod may make room at maxPods
// for a new one: not while a new one is still starting, nor while the new
// ones fail (an old pod gone for a new one that never comes is a warm pod lost).
func (ro rollout) mayEvictForRoom(newStarting int) bool {
	return ro.stalled == "" && newStarting == 0
}

// condition is the pool's Progressing condition.
func (ro rollout) condition(generation int64) metav1.Condition {
	c := metav1.Condition{Type: sandboxv1alpha1.PoolConditionProgressing, ObservedGeneration: generation, Status: metav1.ConditionTrue}
	busy := ""
	if ro.oldBusy > 0 {
		busy = fmt.Sprintf("; %d busy pod(s) finish their work on an older template", ro.oldBusy)
	}
	switch {
	case ro.old == 0:
		c.Reason = sandboxv1alpha1.ReasonRolloutComplete
		c.Message = fmt.Sprintf("all %d unclaimed pod(s) run the current template%s", ro.updated, busy)
	case ro.stalled != "":
		c.Status, c.Reason = metav1.ConditionFalse, sandboxv1alpha1.ReasonRolloutStalled
		c.Message = fmt.Sprintf("%d old pod(s) keep serving: pods of the current template do not start (%s); fix the pool's spec or roll it back",
			ro.old, ro.stalled)
	default:
		c.Reason = sandboxv1alpha1.ReasonRollingOut
		c.Message = fmt.Sprintf("%d unclaimed pod(s) of the current template, %d old one(s) serve until new ones are Ready to take their place%s",
			ro.updated, ro.old, busy)
	}
	return c
}

// agentVersions counts the pool's Ready pods by the agent they run, as far
// as the manager asked them: at most maxAgentBuilds builds, the most pods first.
func agentVersions(agents *agentcheck.Checker, pods poolPods) []sandboxv1alpha1.AgentVersionCount {
	if agents == nil {
		return nil
	}
	counts := map[agentcheck.Info]int32{}
	for _, group := range [][]*corev1.Pod{pods.idle, pods.staleIdle, pods.busy} {
		for _, p := range group {
			if !sandboxpod.IsReady(p) {
				continue
			}
			if info, ok := agents.Lookup(p.UID); ok {
				counts[info]++
			}
		}
	}
	out := make([]sandboxv1alpha1.AgentVersionCount, 0, len(counts))
	for info, n := range counts {
		out = append(out, sandboxv1alpha1.AgentVersionCount{Build: info.Build, Protocol: int32(info.Protocol), Replicas: n, Supported: info.Supported})
	}
	slices.SortFunc(out, func(a, b sandboxv1alpha1.AgentVersionCount) int {
		return cmp.Or(cmp.Compare(b.Replicas, a.Replicas), cmp.Compare(a.Build, b.Build), cmp.Compare(a.Protocol, b.Protocol))
	})
	if len(out) > maxAgentBuilds {
		out = out[:maxAgentBuilds]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

const maxAgentBuilds = 10
