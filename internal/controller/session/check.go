package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/podstatus"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// notReadyFor is how long the kubelet has reported the pod not Ready (its
// probe of the agent failing); 0 for a Ready pod.
func notReadyFor(pod *corev1.Pod, now time.Time) time.Duration {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			return now.Sub(c.LastTransitionTime.Time)
		}
	}
	return 0
}

// podDown says why a Session's pod that stayed not Ready is given up: how
// long, the agent's silence, and what the kubelet knows (OOM kill, crash loop).
func podDown(pod *corev1.Pod, down time.Duration, agentErr error) string {
	msg := fmt.Sprintf("pod %s has not been Ready for %s", pod.Name, down.Round(time.Second))
	if agentErr != nil {
		msg += fmt.Sprintf(" and its agent does not answer (%v)", agentErr)
	}
	if why, whyMsg := podstatus.End(pod); why != "" {
		return whyMsg + "; " + msg
	}
	if reason, detail := podstatus.Trouble(pod); reason != "" {
		msg += fmt.Sprintf(" (%s: %s)", reason, detail)
	}
	return msg
}

// check watches a Ready Session: its pod, its interpreter, its idle timeout
// and its maximum lifetime.
func (r *Reconciler) check(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	now := r.Clock.Now()
	pod, gone, err := r.sessionPod(ctx, ses)
	if err != nil {
		return ctrl.Result{}, err
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil // deleted: the Session keeps its pod until it ends
	}
	if gone.msg != "" {
		reason := sandboxv1alpha1.ReasonSandboxLost
		if gone.reason != "" {
			reason = gone.reason
		}
		return r.recoverOrLose(ctx, ses, pool, gone.node, reason, gone.msg, "")
	}
	if pool != nil {
		// A shared pool's tenant whose namespace lost its admission (the
		// platform unlabelled it, the pool's selector changed) stops using
		// the platform's pod: a run under way finishes, nothing follows it.
		if err := r.Tenancy.Admit(ctx, pool, ses.Namespace); err != nil {
			var refused *tenancy.Refusal
			if !errors.As(err, &refused) {
				return ctrl.Result{}, err
			}
			return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, refused.Reason,
				"its namespace may no longer use the pool: "+refused.Message)
		}
	}
	if m := ses.Spec.MaxLifetime; m != nil && ses.Status.ReadyTime != nil && !now.Before(ses.Status.ReadyTime.Add(m.Duration)) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonMaxLifetime,
			fmt.Sprintf("reached its maximum lifetime of %s", m.Duration))
	}
	if from, waiting := ses.Annotations[sandboxv1alpha1.AnnotationRestoring]; waiting && ses.Status.ReadyTime != nil &&
		!now.Before(ses.Status.ReadyTime.Add(restoreDeadline)) {
		// Nothing runs in it until a restore, which will not come: its pod goes back now.
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonNeverRestored, fmt.Sprintf(
			"it waited for its state from a snapshot (%s: %s) and was not given it within %s of being Ready", sandboxv1alpha1.AnnotationRestoring, from, restoreDeadline))
	}
	if lost := r.Nodes.Lost(pod.Spec.NodeName); lost != "" {
		// Not asked first: an agent on a node that went silent answers no
		// one, and the question would only wait for its timeout.
		return r.recoverOrLose(ctx, ses, pool, pod.Spec.NodeName, sandboxv1alpha1.ReasonNodeLost, lost,
			fmt.Sprintf("; the Session's state was in its pod %s's memory and is gone: start a new Session", pod.Name))
	}
	health, herr := r.health(ctx, ses, pool, pod)
	if herr == nil && health.Interpreter != "" && ses.Status.Interpreter != "" && health.Interpreter != ses.Status.Interpreter {
		why := health.LastEnd
		if why == "" {
			why = "killed at its memory limit, or it did not stop at an interrupt"
		}
		return r.recoverOrLose(ctx, ses, pool, pod.Spec.NodeName, sandboxv1alpha1.ReasonInterpreterRestarted,
			"the interpreter was replaced ("+why+")", ": its state is gone")
	}
	down := notReadyFor(pod, now)
	if herr != nil && down >= sessionUnreachableGrace {
		return r.recoverOrLose(ctx, ses, pool, pod.Spec.NodeName, sandboxv1alpha1.ReasonSandboxLost, podDown(pod, down, herr), "")
	}
	if herr == nil {
		r.keepCheckpoints(ctx, ses, pool, pod)
	}
	last := ses.Status.LastActivityTime.DeepCopy()
	if t, err := time.Parse(time.RFC3339Nano, pod.Annotations[sandboxpod.AnnotationLastUsed]); err == nil && (last == nil || t.After(last.Time)) {
		last = &metav1.Time{Time: t}
	}
	runs, busy := ses.Status.Runs, lease.ClaimedBy(pod) != ""
	if herr == nil {
		// The agent's clock (or a compromised agent) must not keep a Session alive past now.
		if h := health.LastActivity; h != nil && (last == nil || h.After(last.Time)) {
			t := *h
			if t.After(now) {
				t = now
			}
			last = &metav1.Time{Time: t}
		}
		runs, busy = max(runs, health.Runs), busy || health.Busy > 0
	}
	idle := idleTimeout(ses, pool)
	due, suspends := r.suspendDue(ses, pool, last, now)
	drained := r.Nodes.Drains(pod.Spec.NodeName)
	switch {
	case r.Snapshots != nil && (lease.Suspending(pod) || herr == nil && health.Sealed):
		// A suspend that did not commit (the manager stopped, the store
		// failed): the seal decided it, whatever happened since.
		return r.suspend(ctx, ses, pod, last, runs, drained)
	case herr == nil && health.Sealed:
		if agent, err := r.agent(ctx, ses, pod, agentgate.ForSession(ses)); err == nil {
			_ = agent.Unseal(ctx) // sealed by a manager that had a store; this one has none
		}
	case drained != "" && herr == nil && r.mayMove(ses, now):
		return r.move(ctx, ses, pod, last, runs, busy, drained)
	case drained == "" && meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionMovable) != nil:
		// The node is not drained any more (uncordoned): nothing waits on the Session.
		meta.RemoveStatusCondition(&ses.Status.Conditions, sandboxv1alpha1.SessionConditionMovable)
		if err := r.Status().Update(ctx, ses); err != nil {
			return ctrl.Result{}, fmt.Errorf("store status of session %s: %w", ses.Name, err)
		}
		return ctrl.Result{Requeue: true}, nil
	case suspends && !busy && herr == nil && due <= 0 && now.Before(last.Add(idle)):
		return r.suspend(ctx, ses, pod, last, runs, "")
	}
	if drained != "" && r.Snapshots == nil {
		// It stays: say why, and look after it as any Ready Session.
		if err := r.unmovable(ctx, ses, pod, drained, nil); err != nil {
			return ctrl.Result{}, err
		}
	}
	if last != nil && !busy && !now.Before(last.Add(idle)) {
		if herr != nil && now.Before(last.Add(idle+sessionUnreachableGrace)) {
			// Cannot ask the agent whether a data-plane run is under way: look
			// again soon, and close it anyway once an unanswering agent has had
			// its grace (no run can reach it either).
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonIdleTimeout,
			fmt.Sprintf("idle for %s (idleTimeout %s)", now.Sub(last.Time).Round(time.Second), idle))
	}
	if last != nil {
		// Stored to the second: compared to the second, or every look after
		// a run (the agent and the pod's annotation keep nanoseconds) would
		// write the Session again with what it already holds.
		t := last.Rfc3339Copy()
		last = &t
	}
	ck := r.lastCheckpoint(client.ObjectKeyFromObject(ses))
	newCheckpoint := ck != nil && (ses.Status.Checkpoint == nil || ses.Status.Checkpoint.Key != ck.Key)
	if (runs != ses.Status.Runs || !last.Equal(ses.Status.LastActivityTime) || newCheckpoint) && r.mayWriteActivity(ses.UID, now) {
		ses.Status.Runs, ses.Status.LastActivityTime = runs, last
		if newCheckpoint {
			ses.Status.Checkpoint = ck.DeepCopy()
		}
		if err := r.Status().Update(ctx, ses); err != nil {
			return ctrl.Result{}, fmt.Errorf("store activity of session %s: %w", ses.Name, err)
		}
	}
	// A busy Session is looked at again within one idle timeout: its run may
	// end (an Execution's release wakes nobody) and the clock start then.
	next := min(sessionCheckInterval, idle)
	if last != nil && !busy {
		next = min(next, last.Add(idle).Sub(now)+10*time.Millisecond)
	}
	if suspends && !busy {
		next = min(next, due+10*time.Millisecond)
	}
	if m := ses.Spec.MaxLifetime; m != nil && ses.Status.ReadyTime != nil {
		next = min(next, ses.Status.ReadyTime.Add(m.Duration).Sub(now)+10*time.Millisecond)
	}
	if herr != nil {
		// An agent that does not answer is asked again when its grace ends
		// (or sooner: a pod that turns Ready again wakes the Session).
		next = min(next, max(sessionUnreachableGrace-down, time.Second))
	}
	return ctrl.Result{RequeueAfter: max(next, 10*time.Millisecond)}, nil
}

// sessionPod returns a Ready Session's pod, or why it is gone. A pod the
// cache does not show is looked up around it before the Session is lost.
func (r *Reconciler) sessionPod(ctx context.Context, ses *sandboxv1alpha1.Session) (*corev1.Pod, podGone, error) {
	key := ses.PodKey()
	pod := &corev1.Pod{}
	err := r.Get(ctx, key, pod)
	if err == nil && lease.HeldBy(pod, ses) && !sandboxpod.IsTerminal(pod) && pod.DeletionTimestamp == nil {
		return pod, podGone{}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, podGone{}, err
	}
	if err := r.APIReader.Get(ctx, key, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, podGone{msg: fmt.Sprintf("pod %s was deleted, and with it the session's state", key.Name)}, nil
		}
		return nil, podGone{}, err
	}
	switch {
	case ses.Status.PodUID != "" && pod.UID != ses.Status.PodUID:
		return nil, podGone{msg: fmt.Sprintf("pod %s was deleted, and with it the session's state (a pod now under its name is another one)", key.Name)}, nil
	case !lease.HeldBy(pod, ses) && lease.Session(pod) == "" && lease.ClaimedBy(pod) == "":
		// Ready, but the claim written with the status never landed (the
		// manager stopped in between): the dispatcher kept the pod for the
		// Session; write the claim now.
		held, err := r.claimNamedPod(ctx, ses)
		if err != nil || !held {
			return nil, podGone{msg: fmt.Sprintf("pod %s was never claimed by the session, and is no longer free for it", key.Name)}, err
		}
		if err := r.APIReader.Get(ctx, key, pod); err != nil {
			return nil, podGone{}, err
		}
		return pod, podGone{}, nil
	case !lease.HeldBy(pod, ses):
		return nil, podGone{msg: fmt.Sprintf("pod %s no longer belongs to the session", key.Name), node: pod.Spec.NodeName}, nil
	case sandboxpod.IsTerminal(pod):
		// Why it ended, when the kubelet said (the memory limit, an
		// eviction): its pool keeps an ended pod until this is stored.
		if why, msg := podstatus.End(pod); why != "" {
			return nil, podGone{reason: why, msg: msg + ", and with it the session's state", node: pod.Spec.NodeName}, nil
		}
		if pod.DeletionTimestamp != nil {
			return nil, podGone{msg: fmt.Sprintf("pod %s is being deleted, and with it the session's state", key.Name), node: pod.Spec.NodeName}, nil
		}
		reason, msg := podstatus.Trouble(pod)
		if reason == "" {
			reason, msg = string(pod.Status.Phase), pod.Status.Message
		}
		return nil, podGone{msg: fmt.Sprintf("pod %s stopped (%s: %s)", key.Name, reason, msg), node: pod.Spec.NodeName}, nil
	}
	return pod, podGone{}, nil
}

// podGone says why a Session's pod is gone: msg, and a reason of its own
// when the pod said why it ended; node is the pod's, when it is still known.
type podGone struct{ reason, msg, node string }

func (r *Reconciler) health(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (*protocol.Health, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	agent, err := r.Gate.Open(ctx, pool, pod, agentgate.ForSession(ses))
	if err != nil {
		return nil, err
	}
	h, err := agent.Ready(ctx)
	if err != nil {
		metrics.AgentErrors.WithLabelValues("health").Inc()
	}
	return h, err
}

// mayWriteActivity rations the writes of a Session's activity.
func (r *Reconciler) mayWriteActivity(uid types.UID, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.statusWritten[uid]; ok && now.Sub(t) < sessionStatusInterval {
		return false
	}
	r.statusWritten[uid] = now
	return true
}

func idleTimeout(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool) time.Duration {
	switch {
	case ses.Spec.IdleTimeout != nil:
		return ses.Spec.IdleTimeout.Duration
	case pool != nil && pool.Spec.SessionIdleTimeout != nil:
		return pool.Spec.SessionIdleTimeout.Duration
	}
	return defaultSessionIdleTimeout
}
