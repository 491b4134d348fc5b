// Package controller assembles the manager's parts (Setup, Runtime): the
// reconcilers, one package per object (pool, execution, session,
// modelendpoint, agentkeys), and the data plane. The RBAC markers below, and
// those next to each reconciler, are the permissions the manager needs;
// controller-gen turns them into config/rbac/role.yaml.
package controller

// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sandboxpools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sandboxpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sandboxpools/finalizers,verbs=update
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=executions,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=executions/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=executions/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;update;patch;delete
// codeFrom: Secrets and ConfigMaps are read one at a time, uncached, and used
// only when their owner labelled them sandbox.warmpool.dev/code=true. The
// agent keys Secret in the manager's own namespace is a namespaced Role
// (agentkeys/reconciler.go).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// Shared pools admit namespaces by their labels (internal/tenancy), read from a cache.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// Nodes a pool may no longer hand out pods on (cordoned, draining, tainted,
// not Ready: internal/nodes) are read from a cache, never written.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
