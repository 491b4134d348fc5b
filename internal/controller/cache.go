package controller

import (
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// CacheOptions limits the manager's informers to what warmpool owns: sandbox
// pods and the pools' PodDisruptionBudgets, not every pod of the cluster, and
// of all Secrets only the agent keys Secret. Other objects (codeFrom's
// ConfigMaps and Secrets) are read without a cache. NetworkPolicies are all
// cached (they are few and small): the pool reports the other policies that
// select its pods, since any of them can open what the pool's own one closes.
//
// Managed fields are dropped from every cached object: nothing here reads
// them, and each cache read copies the object (the data plane's per-run
// profile spent a tenth of its cache reads copying them). An update of an
// object read so leaves its managed fields as they are on the server.
func CacheOptions(agentKeys types.NamespacedName) cache.Options {
	owned := labels.NewSelector()
	req, _ := labels.NewRequirement(sandboxpod.LabelPool, selection.Exists, nil)
	owned = owned.Add(*req)
	return cache.Options{DefaultTransform: cache.TransformStripManagedFields(), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Label: owned},
		&policyv1.PodDisruptionBudget{}: {Label: owned},
		// What placement reads of each node, not its images and volumes.
		&corev1.Node{}: {Transform: nodes.Trim},
		&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{agentKeys.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", agentKeys.Name),
		},
	}}
}
