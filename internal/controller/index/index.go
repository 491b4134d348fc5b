// Package index names the cache indexes the reconcilers query and registers
// them with the manager, and limits what the manager's informers cache.
package index

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// Cache indexes of Executions. Reconciles list only what they need: finished
// Executions pile up (until their TTL), and the hot paths must not scan them.
const (
	// Session: "pool/session", for Executions of a session, finished ones too.
	Session = "warmpool.pool.session"
	// ActiveSession: "pool/session", for unfinished Executions of a session.
	ActiveSession = "warmpool.active.session"
	// ClaimedUID: on pods, the UID of the Execution that claimed the pod.
	ClaimedUID = "warmpool.claimed.uid"
	// PodNode: on pods, the node they run on: the pods to judge again when
	// their node changes (cordoned, tainted, lost).
	PodNode = "warmpool.pod.node"
)

// Setup registers the cache indexes the reconcilers query.
func Setup(ctx context.Context, mgr ctrl.Manager) error {
	fi := mgr.GetFieldIndexer()
	if err := fi.IndexField(ctx, &sandboxv1alpha1.Execution{}, Session, func(o client.Object) []string {
		if ex := o.(*sandboxv1alpha1.Execution); ex.Spec.Session != "" {
			return []string{SessionKey(ex.Spec.PoolRef.String(), ex.Spec.Session)}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &sandboxv1alpha1.Execution{}, ActiveSession, func(o client.Object) []string {
		if ex := o.(*sandboxv1alpha1.Execution); ex.Spec.Session != "" && !ex.Status.Phase.IsFinished() {
			return []string{SessionKey(ex.Spec.PoolRef.String(), ex.Spec.Session)}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &corev1.Pod{}, PodNode, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return err
	}
	return fi.IndexField(ctx, &corev1.Pod{}, ClaimedUID, func(o client.Object) []string {
		if uid := o.GetAnnotations()[sandboxpod.AnnotationClaimedUID]; uid != "" {
			return []string{uid}
		}
		return nil
	})
}

// SessionKey is the value of the Session indexes: a session is named within its pool.
func SessionKey(pool, session string) string { return pool + "/" + session }
