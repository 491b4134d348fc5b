package pool

import (
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// quotaRetry is how soon a pool the namespace's ResourceQuota held back
// tries again: quota frees as any pod of the namespace ends, and only the
// pool's own pods wake it.
const quotaRetry = 10 * time.Second

// quotaError is a pod creation the namespace's ResourceQuota refused: a
// limit the namespace's owner set, not a fault of the pool, so it leaves the
// pool healthy and out of the error backoff.
type quotaError struct{ err error }

func (e *quotaError) Error() string { return e.err.Error() }
func (e *quotaError) Unwrap() error { return e.err }

// refusedByQuota tells a quota refusal from the other reasons the API server
// forbids a pod (a policy, a missing RuntimeClass): the quota admission
// plugin's message names the quota.
func refusedByQuota(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}

// scalingLimit is what holds a pool below the pods it wants: the first
// reason found, with every limit's message.
type scalingLimit struct {
	reason   string
	messages []string
}

func (l *scalingLimit) add(reason, message string) {
	if l.reason == "" {
		l.reason = reason
	}
	l.messages = append(l.messages, message)
}

// quota records a refused creation, with n pods still wanted.
func (l *scalingLimit) quota(err error, n int) bool {
	var qe *quotaError
	if !errors.As(err, &qe) {
		return false
	}
	msg := qe.err.Error()
	var status apierrors.APIStatus
	if errors.As(qe.err, &status) {
		msg = status.Status().Message
	}
	l.add(sandboxv1alpha1.ReasonResourceQuota, fmt.Sprintf("%d more pods wanted, refused: %s; raise the namespace's ResourceQuota or lower the pool's replicas", n, msg))
	return true
}

func (l *scalingLimit) condition(generation int64) metav1.Condition {
	c := metav1.Condition{Type: sandboxv1alpha1.PoolConditionScalingLimited, ObservedGeneration: generation,
		Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.ReasonWithinLimits, Message: "the pool has or is starting every pod it wants"}
	if l.reason != "" {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, l.reason, strings.Join(l.messages, "; ")
	}
	return c
}
