package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
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
