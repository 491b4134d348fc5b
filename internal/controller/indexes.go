package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// Cache indexes of Executions. Reconciles list only what they need: finished
// Executions pile up (until their TTL), and the hot paths must not scan them.
const (
	// indexSession: "pool/session", for Executions of a session, finished ones too.
	indexSession = "warmpool.pool.session"
	// indexActiveSession: "pool/session", for unfinished Executions of a session.
	indexActiveSession = "warmpool.active.session"
	// indexClaimedUID: on pods, the UID of the Execution that claimed the pod.
	indexClaimedUID = "warmpool.claimed.uid"
)

// SetupIndexes registers the cache indexes the reconcilers query.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	fi := mgr.GetFieldIndexer()
	if err := fi.IndexField(ctx, &sandboxv1alpha1.Execution{}, indexSession, func(o client.Object) []string {
		if ex := o.(*sandboxv1alpha1.Execution); ex.Spec.Session != "" {
			return []string{sessionKey(ex.Spec.PoolRef.Name, ex.Spec.Session)}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &sandboxv1alpha1.Execution{}, indexActiveSession, func(o client.Object) []string {
		if ex := o.(*sandboxv1alpha1.Execution); ex.Spec.Session != "" && !ex.Status.Phase.IsFinished() {
			return []string{sessionKey(ex.Spec.PoolRef.Name, ex.Spec.Session)}
		}
		return nil
	}); err != nil {
		return err
	}
	return fi.IndexField(ctx, &corev1.Pod{}, indexClaimedUID, func(o client.Object) []string {
		if uid := o.GetAnnotations()[sandboxpod.AnnotationClaimedUID]; uid != "" {
			return []string{uid}
		}
		return nil
	})
}

func clientKey(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }

// CacheOptions limits the manager's informers to what warmpool owns: sandbox
// pods and the pools' PodDisruptionBudgets, not every pod of the cluster, and
// of all Secrets only the agent keys Secret. Other objects (codeFrom's
// ConfigMaps and Secrets) are read without a cache. NetworkPolicies are all
// cached (they are few and small): the pool reports the other policies that
// select its pods, since any of them can open what the pool's own one closes.
func CacheOptions(agentKeys types.NamespacedName) cache.Options {
	owned := labels.NewSelector()
	req, _ := labels.NewRequirement(sandboxpod.LabelPool, selection.Exists, nil)
	owned = owned.Add(*req)
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Label: owned},
		&policyv1.PodDisruptionBudget{}: {Label: owned},
		&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{agentKeys.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", agentKeys.Name),
		},
	}}
}
