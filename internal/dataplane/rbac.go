package dataplane

// The data plane's own role (config/dataplane/role.yaml, generated from
// these markers alone): it runs with a ServiceAccount of its own, and, as the
// part of warmpool every caller reaches, may only read what it serves, record
// a Session's interpreter, create and close the Sessions of one-call runs
// (owned by their callers: "delegate", see config/admission), claim an idle
// pod for such a run (lease.ClaimForRun: an update of the pod's labels and
// annotations, which the warmpool-data-plane-pods admission policy holds it
// to), read the agent keys and keep its serving certificate, and answer
// llm_query from a pool's ModelEndpoint. It cannot create or delete pods,
// change anything else of them, nor write the keys.
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions,verbs=get;list;watch;create;patch;delegate
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sessions/status,verbs=get;patch
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=sandboxpools,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update
// Nodes, read: a one-call run claims no idle pod on a node that is cordoned,
// drained or not Ready (internal/nodes).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// A pool's ModelEndpoint, the namespaces its selector admits and (below, in
// the manager's namespace) its key: llm_query in a Session's runs.
// +kubebuilder:rbac:groups=sandbox.warmpool.dev,resources=modelendpoints,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// The agent keys (read) and the serving certificate's Secret, in the
// manager's namespace; the APIService whose caBundle trusts the certificate.
// +kubebuilder:rbac:groups="",namespace=warmpool-system,resources=secrets,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",namespace=warmpool-system,resources=secrets,verbs=update,resourceNames=warmpool-data-plane-cert
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;patch,resourceNames=v1alpha1.data.warmpool.dev
