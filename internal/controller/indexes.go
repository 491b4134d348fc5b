package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// indexPoolRef indexes Executions by spec.poolRef.name.
const indexPoolRef = "spec.poolRef.name"

// SetupIndexes registers the cache indexes the reconcilers query.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &sandboxv1alpha1.Execution{}, indexPoolRef, func(o client.Object) []string {
		return []string{o.(*sandboxv1alpha1.Execution).Spec.PoolRef.Name}
	})
}

func clientKey(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }

// CacheOptions limits the manager's informers to what warmpool owns: sandbox
// pods and the pools' token Secrets, not every pod and Secret of the cluster.
// Other objects (codeFrom's ConfigMaps and Secrets) are read without a cache.
func CacheOptions() cache.Options {
	owned := labels.NewSelector()
	req, _ := labels.NewRequirement(sandboxpod.LabelPool, selection.Exists, nil)
	owned = owned.Add(*req)
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:    {Label: owned},
		&corev1.Secret{}: {Label: owned},
	}}
}
