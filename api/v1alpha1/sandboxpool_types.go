package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeSpread says how a pool's pods are spread over nodes when its template
// sets no topologySpreadConstraints of its own.
// +kubebuilder:validation:Enum=Preferred;Required;None
type NodeSpread string

const (
	// NodeSpreadPreferred asks the scheduler to keep the pool's pods on as
	// many nodes as it can (maxSkew 1 on kubernetes.io/hostname), and still
	// schedules a pod where it cannot: losing or draining one node takes a
	// share of the pool, not all of it.
	NodeSpreadPreferred NodeSpread = "Preferred"
	// NodeSpreadRequired holds the skew at 1: a pod that would break it waits
	// unscheduled, until a node frees up or joins.
	NodeSpreadRequired NodeSpread = "Required"
	// NodeSpreadNone leaves placement to the scheduler alone (and to the
	// template's affinity).
	NodeSpreadNone NodeSpread = "None"
)

// ReusePolicy says whether a sandbox pod may run more than one Execution (or session).
// +kubebuilder:validation:Enum=Never;FreshInterpreter
type ReusePolicy string

const (
	// ReuseNever deletes a pod after it has run one Execution or one session.
	ReuseNever ReusePolicy = "Never"
	// ReuseFreshInterpreter returns a used pod to the pool after restarting its
	// interpreter. Files in the workspace and anything the code changed outside
	// the interpreter survive, so use it only for code you trust.
	ReuseFreshInterpreter ReusePolicy = "FreshInterpreter"
)

// Limits of the API. They keep an Execution (spec plus captured output) well
// below etcd's 1.5 MiB object limit.
const (
	// MaxOutputBytesLimit is the largest per-stream output a pool may keep in an Execution's status.
	MaxOutputBytesLimit = 131072
	// DefaultMaxOutputBytes is the per-stream output kept when a pool does not say.
	DefaultMaxOutputBytes = 65536
)

// SandboxPoolSpec is the desired state of a pool of warm sandbox pods.
// +kubebuilder:validation:XValidation:rule="!has(self.maxPods) || self.maxPods >= self.replicas",message="spec.maxPods must be greater than or equal to spec.replicas: raise maxPods or lower replicas"
type SandboxPoolSpec struct {
	// replicas is the number of warm, idle pods to keep ready for new Executions.
	// Busy pods do not count. This is what `kubectl scale` and autoscalers change.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas int32 `json:"replicas"`

	// maxPods caps the pool's pods, idle and busy together. When it is reached,
	// new Executions wait for a pod to be freed. Unset means no cap on the total,
	// but at most 20 pods are started at a time for waiting Executions beyond
	// spec.replicas, so a burst of a thousand does not ask for a thousand pods at once.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxPods *int32 `json:"maxPods,omitempty"`

	// image is the sandbox container image: python3 plus the warmpool agent as entrypoint.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Image string `json:"image"`

	// imagePullPolicy of the sandbox container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// resources of the sandbox container. Limits are always set on sandbox pods:
	// when a limit is not given here, the operator applies its default. The
	// default CPU request is what an idle warm sandbox uses (about 1 % of a
	// core, docs/performance.md), so a node is packed by what a warm pool
	// costs; running code bursts up to the limit. Raise it for pools whose
	// code should keep a share of a contended node.
	// +kubebuilder:default={limits:{cpu:"1",memory:"512Mi"},requests:{cpu:"10m",memory:"128Mi"}}
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// env is set in the sandbox container for every Execution of the pool.
	// Values may not come from Secrets or ConfigMaps: the pool's code could
	// read them, and creating a pool must not imply reading the namespace's
	// Secrets. Names starting with WARMPOOL_ are the operator's.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, !has(e.valueFrom) || (!has(e.valueFrom.secretKeyRef) && !has(e.valueFrom.configMapKeyRef)))",message="spec.env must not read Secrets or ConfigMaps (valueFrom.secretKeyRef, valueFrom.configMapKeyRef): sandbox code could read them back; set value, or pass per-run values with an Execution's spec.env"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !e.name.startsWith('WARMPOOL_'))",message="spec.env names starting with WARMPOOL_ are reserved for the operator: rename the variable"
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// template carries the pod settings the operator does not manage: labels,
	// annotations, scheduling and image pull secrets. The operator builds the
	// sandbox container, volumes and security settings itself.
	// +optional
	Template *SandboxPodTemplate `json:"template,omitempty"`

	// nodeSpread spreads the pool's pods over nodes: Preferred (the default),
	// Required or None. It applies to pods created after it is set, and only
	// when spec.template.spec.topologySpreadConstraints is empty (those, when
	// set, are used as they are).
	// +kubebuilder:default=Preferred
	// +optional
	NodeSpread NodeSpread `json:"nodeSpread,omitempty"`

	// runtimeClassName of the sandbox pods. Defaults to gvisor, which isolates
	// user code from the node's kernel. Set it to "" only for trusted code or on
	// clusters without gVisor.
	// +kubebuilder:default=gvisor
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="spec.runtimeClassName must be a RuntimeClass name (lowercase letters, digits, '-' and '.'), or \"\" to run without one"
	// +optional
	RuntimeClassName *string `json:"runtimeClassName,omitempty"`

	// python configures the interpreter each pod keeps warm.
	// +kubebuilder:default={}
	// +optional
	Python PythonSpec `json:"python,omitempty"`

	// limits bound what the code in each sandbox may use, inside the container's
	// own limits: code that reaches them gets an error it can see (MemoryError,
	// BlockingIOError) and its Execution says which limit it hit, instead of the
	// pod being killed with everything the code printed.
	// +kubebuilder:default={}
	// +optional
	Limits SandboxLimits `json:"limits,omitempty"`

	// executionDefaults apply to every Execution of the pool that does not say otherwise.
	// +kubebuilder:default={}
	// +optional
	ExecutionDefaults ExecutionDefaults `json:"executionDefaults,omitempty"`

	// sessionIdleTimeout is how long a session keeps its pod after its last
	// Execution finished. Then the pod, and the session's state, are deleted.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="spec.sessionIdleTimeout must be between 1s and 24h"
	// +optional
	SessionIdleTimeout *metav1.Duration `json:"sessionIdleTimeout,omitempty"`

	// sessionSuspendAfter suspends the pool's Sessions once they are idle this
	// long, unless they set their own suspendAfter: each one's state (its
	// namespace, and workspace files within the snapshot limit) is saved,
	// encrypted, to the manager's snapshot store, and its pod freed; its next
	// run resumes it on a warm pod, same name, same state. Unset: Sessions
	// keep their pods until their idle timeout. Needs a snapshot store in the
	// manager's configuration (condition SessionSuspend says whether there is one).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="spec.sessionSuspendAfter must be between 1s and 24h"
	// +optional
	SessionSuspendAfter *metav1.Duration `json:"sessionSuspendAfter,omitempty"`

	// sessionCheckpoint makes the pool's Sessions durable (a Session's own
	// spec.checkpoint wins): their state is saved to the snapshot store after
	// their runs, and a Session whose pod or node is lost resumes from its
	// last checkpoint. Needs a snapshot store in the manager's configuration.
	// +optional
	SessionCheckpoint *SessionCheckpointPolicy `json:"sessionCheckpoint,omitempty"`

	// sessionTTLSecondsAfterFinished deletes the pool's Sessions this long
	// after they ended (Closed or Lost), unless they set their own. Unset:
	// 3600 (one hour).
	// +kubebuilder:validation:Minimum=0
	// +optional
	SessionTTLSecondsAfterFinished *int32 `json:"sessionTTLSecondsAfterFinished,omitempty"`

	// reusePolicy says whether a used pod is deleted (Never, the default) or
	// returned to the pool with a fresh interpreter (FreshInterpreter).
	// +kubebuilder:default=Never
	// +optional
	ReusePolicy ReusePolicy `json:"reusePolicy,omitempty"`

	// network says what the sandbox pods may reach. The operator keeps a
	// NetworkPolicy per pool: ingress only to the agent port and only from the
	// manager; no egress at all (DNS included) unless listed here.
	// +optional
	Network *NetworkSpec `json:"network,omitempty"`

	// llm names the ModelEndpoint that answers llm_query and rlm_query in
	// this pool's Executions; the manager makes the calls. Unset: those calls
	// raise RuntimeError in Executions. (In Sessions the caller answers them.)
	// +optional
	LLM *PoolLLM `json:"llm,omitempty"`

	// autoscaling sizes the pool from its demand: when set, the manager owns
	// spec.replicas (it writes it; do not also point an HPA or
	// KEDA at the pool) and status.autoscaling says how it chose. Unset: the
	// pool keeps spec.replicas idle pods.
	// +optional
	Autoscaling *PoolAutoscaling `json:"autoscaling,omitempty"`

	// sharing lets Executions and Sessions of other namespaces use this pool
	// (their spec.poolRef names this pool and its namespace): one warm pool
	// for many tenants. The pool's pods stay in this namespace, which the
	// platform owns: the manager honours sharing only in the namespaces it is
	// told to (--shared-pool-namespaces), since whoever controls this
	// namespace can read every tenant's code. A pod runs one tenant's code
	// only: a used pod is deleted, or with FreshInterpreter reuse goes back
	// to the same namespace's work only. Unset: the pool serves its own namespace.
	// +optional
	Sharing *PoolSharing `json:"sharing,omitempty"`
}

// PoolSharing says which namespaces share a pool, and how much of it each may hold.
type PoolSharing struct {
	// namespaceSelector picks the tenant namespaces by their labels (which
	// tenants cannot change). An empty selector admits every namespace.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// limits apply to each tenant namespace that tenants does not name.
	// +kubebuilder:default={}
	// +optional
	Limits TenantLimits `json:"limits,omitempty"`

	// reservedIdlePods are idle pods kept for namespaces that hold none of
	// the pool's pods and wait for no more than this many: any other
	// namespace takes an idle pod only while more than this many are idle.
	// One namespace's burst then leaves warm pods for the first runs of the
	// others, while the pool adds pods for the burst. The pool keeps at least
	// this many idle pods, whatever spec.replicas (or its autoscaler) says,
	// and replaces one taken from them at once. Size it at about the other
	// tenants' claims per second times a pod's start-up under load. 0 (the
	// default): every idle pod goes to whoever waits.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ReservedIdlePods int32 `json:"reservedIdlePods,omitempty"`

	// tenants gives namespaces a weight and limits of their own.
	// +listType=map
	// +listMapKey=namespace
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	Tenants []TenantPolicy `json:"tenants,omitempty"`
}

// TenantLimits bound what one namespace holds of a shared pool. Unset: no
// bound beyond the pool's own.
type TenantLimits struct {
	// maxPods is how many of the pool's pods the namespace holds at once:
	// its running Executions and its Sessions. Beyond it, its work waits
	// (WaitingForSandbox, reason TenantLimitReached) while others are served.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxPods *int32 `json:"maxPods,omitempty"`

	// maxSessions is how many Sessions of the namespace hold a pod of the pool at once.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxSessions *int32 `json:"maxSessions,omitempty"`

	// maxWaiting is how many of the namespace's Executions may wait for a
	// pod of the pool; one more fails at once (reason TenantQueueFull)
	// rather than wait behind them.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	MaxWaiting *int32 `json:"maxWaiting,omitempty"`
}

// TenantPolicy is one namespace's share of a shared pool.
type TenantPolicy struct {
	// namespace the policy is for.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Namespace string `json:"namespace"`

	// weight of the namespace when pods are shared out among the waiting
	// namespaces: a namespace of weight 2 gets pods as if it held half of
	// what it holds. Default 1.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Weight int32 `json:"weight,omitempty"`

	// limits of this namespace; a field left unset takes the pool's
	// sharing.limits.
	// +kubebuilder:default={}
	// +optional
	Limits TenantLimits `json:"limits,omitempty"`
}

// TenantUsage is what one namespace holds of a shared pool.
type TenantUsage struct {
	// namespace of the tenant.
	Namespace string `json:"namespace"`
	// pods it holds: running Executions and Sessions.
	Pods int32 `json:"pods"`
	// sessions of it that hold a pod.
	Sessions int32 `json:"sessions"`
	// waiting is how many of its Executions and Sessions wait for a pod.
	Waiting int32 `json:"waiting"`
}

// PoolLLM picks the model that Executions' code may ask.
type PoolLLM struct {
	// endpoint is the name of a cluster-scoped ModelEndpoint whose
	// namespaceSelector admits the pool's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Endpoint string `json:"endpoint"`
}

// SandboxLimits bound what the code in one sandbox may use.
type SandboxLimits struct {
	// memoryReserve is the part of the sandbox container's memory limit kept for
	// the agent and the container runtime. The code may use the rest: an
	// allocation past it raises MemoryError, and processes of the code that
	// pass it together are killed (the Execution ends MemoryLimitExceeded).
	// A reserve that leaves less than 32Mi is cut down to leave that much.
	// +kubebuilder:default="96Mi"
	// +optional
	MemoryReserve *resource.Quantity `json:"memoryReserve,omitempty"`

	// processes is how many processes and threads the sandbox's user may have,
	// the agent's (about 10) included; past it, fork and thread creation fail
	// with EAGAIN (BlockingIOError) while the agent keeps answering. 0 turns
	// the limit off: do that for runtimes that share the node's kernel (runc),
	// where the count is node-wide for the sandbox user, and use the kubelet's
	// podPidsLimit there instead. Under gVisor the count is the sandbox's own.
	// +kubebuilder:default=128
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65536
	// +optional
	Processes *int32 `json:"processes,omitempty"`

	// workspaceSize is the size of /workspace, the code's working directory and
	// HOME. Under gVisor it is a filesystem of that size inside the sandbox,
	// kept in a file of the pod's emptyDir on the node's disk: a write past it
	// fails with ENOSPC (OSError "No space left on device"; the Execution ends
	// DiskLimitReached when the code does not catch it) and the pod stays. With
	// other runtimes it is the emptyDir's sizeLimit, which the kubelet enforces
	// by evicting the pod (the Execution ends Evicted).
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('1Mi')) >= 0",message="workspaceSize must be at least 1Mi"
	// +optional
	WorkspaceSize *resource.Quantity `json:"workspaceSize,omitempty"`

	// tmpSize is the size of /tmp, in the same way as workspaceSize.
	// +kubebuilder:default="256Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('1Mi')) >= 0",message="tmpSize must be at least 1Mi"
	// +optional
	TmpSize *resource.Quantity `json:"tmpSize,omitempty"`
}

// NetworkSpec is the network access of a pool's sandbox pods.
type NetworkSpec struct {
	// egress lists the destinations sandbox code may reach; nothing else is
	// allowed, not even DNS (list the cluster DNS Service's address and port 53
	// to allow it). Link-local addresses (169.254.0.0/16, fe80::/10, which hold
	// the clouds' metadata services) and the metadata addresses outside them
	// (100.100.100.200, fd00:ec2::254) can never be reached: they are cut out
	// of every CIDR given here (0.0.0.0/0 included).
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Egress []EgressRule `json:"egress,omitempty"`
}

// EgressRule allows traffic from sandbox pods to a CIDR, on some or all ports.
type EgressRule struct {
	// cidr is the destination network, e.g. 203.0.113.0/24 or 2001:db8::/64,
	// written with its network address (no host bits set).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be a CIDR such as 203.0.113.0/24"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="cidr must be written with its network address (no host bits set), e.g. 10.1.2.0/24 rather than 10.1.2.3/24"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || (!cidr('169.254.0.0/16').containsCIDR(self) && !cidr('fe80::/10').containsCIDR(self) && !cidr('100.100.100.200/32').containsCIDR(self) && !cidr('fd00:ec2::254/128').containsCIDR(self))",message="cidr must not be link-local (169.254.0.0/16, fe80::/10) or a cloud metadata address (100.100.100.200, fd00:ec2::254): metadata services cannot be allowed"
	// +required
	CIDR string `json:"cidr"`

	// ports allowed on that network; empty allows every port.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Ports []EgressPort `json:"ports,omitempty"`
}

// EgressPort is a port, or a range of ports, of one protocol.
// +kubebuilder:validation:XValidation:rule="!has(self.endPort) || self.endPort >= self.port",message="endPort must be greater than or equal to port"
type EgressPort struct {
	// protocol: TCP (default), UDP or SCTP.
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	// +kubebuilder:default=TCP
	// +optional
	Protocol corev1.Protocol `json:"protocol,omitempty"`
	// port number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +required
	Port int32 `json:"port"`
	// endPort makes the rule a range, port to endPort inclusive.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	EndPort *int32 `json:"endPort,omitempty"`
}

// SandboxPodTemplate is the part of a pod template a pool lets users set. It is
// a subset of a PodTemplateSpec on purpose: containers, volumes, the service
// account and security contexts are the sandbox's and cannot be overridden.
type SandboxPodTemplate struct {
	// metadata: labels and annotations added to every sandbox pod. The
	// operator's own labels win over same-named ones here.
	// +optional
	Metadata SandboxPodMetadata `json:"metadata,omitempty"`

	// spec: scheduling settings of the sandbox pods.
	// +optional
	Spec SandboxPodSpec `json:"spec,omitempty"`
}

// SandboxPodMetadata is the metadata a user may add to sandbox pods. Keys
// under sandbox.warmpool.dev/ carry the operator's own state (claims, sessions,
// the agent key) and are refused: a pod born "claimed" would be deleted and
// recreated in a loop, and one labelled as the operator's would pass its
// network policy.
type SandboxPodMetadata struct {
	// labels added to every sandbox pod.
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('sandbox.warmpool.dev/'))",message="spec.template.metadata.labels must not use keys under sandbox.warmpool.dev/: that prefix is reserved for the operator; remove or rename those keys"
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// annotations added to every sandbox pod.
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('sandbox.warmpool.dev/'))",message="spec.template.metadata.annotations must not use keys under sandbox.warmpool.dev/: that prefix is reserved for the operator; remove or rename those keys"
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// SandboxPodSpec holds the scheduling settings of sandbox pods.
type SandboxPodSpec struct {
	// nodeSelector constrains the nodes the pods run on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// tolerations of the pods.
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// affinity of the pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// topologySpreadConstraints of the pods.
	// +listType=atomic
	// +optional
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// priorityClassName of the pods.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// imagePullSecrets to pull the sandbox image with.
	// +listType=atomic
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// schedulerName of the pods; empty means the default scheduler.
	// +optional
	SchedulerName string `json:"schedulerName,omitempty"`
}

// PythonSpec configures the warm interpreter.
type PythonSpec struct {
	// preload lists modules imported while the pod warms up (for example numpy,
	// pandas). A pod is Ready only after all of them imported.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`
	// +optional
	Preload []string `json:"preload,omitempty"`
}

// ExecutionDefaults are the per-pool defaults and limits of Executions.
// +kubebuilder:validation:XValidation:rule="!has(self.timeout) || !has(self.maxTimeout) || duration(self.timeout) <= duration(self.maxTimeout)",message="executionDefaults.timeout must not exceed executionDefaults.maxTimeout"
type ExecutionDefaults struct {
	// timeout of an Execution that does not set spec.timeout.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('24h')",message="timeout must be greater than 0s and at most 24h"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// maxTimeout is the longest timeout an Execution or a Session's run of this
	// pool may ask for: an Execution asking more fails (TimeoutAboveLimit)
	// before it takes a pod, a data-plane run asking more is refused (400),
	// and the sandbox's agent refuses it too. The platform's guard rails can
	// bound it (docs/security.md).
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('24h')",message="maxTimeout must be greater than 0s and at most 24h"
	// +optional
	MaxTimeout *metav1.Duration `json:"maxTimeout,omitempty"`

	// interruptGracePeriod is how long code may take to stop after SIGINT
	// (KeyboardInterrupt) before its pod is deleted.
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('10m')",message="interruptGracePeriod must be between 0s and 10m"
	// +optional
	InterruptGracePeriod *metav1.Duration `json:"interruptGracePeriod,omitempty"`

	// maxOutputBytes is how much of each of stdout and stderr is kept in an
	// Execution's status; the rest is cut with a notice of how much was left out.
	// +kubebuilder:default=65536
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=131072
	// +optional
	MaxOutputBytes int32 `json:"maxOutputBytes,omitempty"`

	// ttlSecondsAfterFinished deletes finished Executions of this pool this long
	// after they finished, unless they set their own. Unset: 3600 (one hour).
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// PoolAutoscaling keeps enough idle pods for the claims (Executions and
// Sessions that need a pod of their own) expected during one pod start-up.
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
type PoolAutoscaling struct {
	// minReplicas is the fewest idle pods kept; 0 scales an idle pool to
	// zero, and its first claim then waits for a pod to start.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MinReplicas int32 `json:"minReplicas"`

	// maxReplicas is the most idle pods kept, whatever the demand.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxReplicas int32 `json:"maxReplicas"`

	// targetWarmRatio is the probability, between 0 and 1 exclusive, that
	// the claims arriving while one pod starts all find a warm pod (e.g.
	// "0.99"): higher keeps more idle pods.
	// +kubebuilder:default="0.99"
	// +kubebuilder:validation:MaxLength=6
	// +kubebuilder:validation:XValidation:rule="self.matches('^0?[.][0-9]{1,4}$') && double(self) > 0.0",message="targetWarmRatio must be a decimal between 0 and 1, e.g. \"0.99\""
	// +optional
	TargetWarmRatio string `json:"targetWarmRatio,omitempty"`

	// scaleDownDelay is how long demand must stay lower before idle pods are
	// removed (then at most half of them at a time). Bursts scale up at once.
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="scaleDownDelay must be between 0s and 24h"
	// +optional
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`
}

// PoolAutoscalingStatus shows the autoscaler's arithmetic, for a person to check.
type PoolAutoscalingStatus struct {
	// desiredReplicas is the idle pods the autoscaler asks for (written to spec.replicas).
	DesiredReplicas int32 `json:"desiredReplicas"`
	// claimRate is claims per second over the last minute, e.g. "0.52".
	ClaimRate string `json:"claimRate"`
	// burstClaimRate is claims per second over the last 6 seconds.
	BurstClaimRate string `json:"burstClaimRate"`
	// warmHitRatio is the share of the claims served in the long window
	// whose pod was Ready before the claim was made, e.g. "0.985"; empty
	// when none was served.
	// +optional
	WarmHitRatio string `json:"warmHitRatio,omitempty"`
	// startupSeconds is the start-up time planned for: the moving mean of the
	// pool's pods' creation-to-Ready times plus their mean deviation.
	StartupSeconds string `json:"startupSeconds"`
	// reason of the last decision: Demand, Burst, ScaleDownDelay,
	// ScaleDownStep, MinReplicas, MaxReplicas or Idle.
	Reason string `json:"reason"`
	// message is the decision in words.
	Message string `json:"message"`
	// lastScaleTime is when desiredReplicas last changed.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
}

// AgentVersionCount is how many of a pool's pods run one agent build.
type AgentVersionCount struct {
	// build is the agent's build: its release, or the commit it was built
	// from ("unknown" for an agent that does not say).
	// +kubebuilder:validation:MaxLength=128
	Build string `json:"build"`
	// protocol is the wire-contract version the agent speaks.
	Protocol int32 `json:"protocol"`
	// replicas is the number of the pool's Ready pods running it.
	Replicas int32 `json:"replicas"`
	// supported is false when this manager does not speak the agent's
	// protocol: its pods are replaced, never called.
	Supported bool `json:"supported"`
}

// SandboxPoolStatus is the observed state of a SandboxPool.
type SandboxPoolStatus struct {
	// replicas is the number of the pool's pods not claimed by an Execution
	// (warming or idle): the count that spec.replicas drives.
	// +optional
	Replicas int32 `json:"replicas"`

	// readyReplicas is the number of the pool's pods whose agent is ready, idle or busy.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// idleReplicas is the number of Ready pods waiting for an Execution.
	// +optional
	IdleReplicas int32 `json:"idleReplicas"`

	// busyReplicas is the number of pods claimed by an Execution or a session.
	// +optional
	BusyReplicas int32 `json:"busyReplicas"`

	// pendingExecutions is the number of Executions waiting for a pod of this pool.
	// +optional
	PendingExecutions int32 `json:"pendingExecutions"`

	// updatedReplicas is the number of unclaimed pods (warming or idle)
	// built from the pool's current template: during a rollout it climbs
	// to replicas while older pods keep serving (the Progressing condition).
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// agents counts the pool's Ready pods by the build and protocol version
	// of their sandbox agent, as each answered the manager (at most 10
	// builds, the most pods first).
	// +listType=map
	// +listMapKey=build
	// +optional
	Agents []AgentVersionCount `json:"agents,omitempty"`

	// warmHitRatio is the share of the pool's claims (Executions, Sessions)
	// of the last minute served by a pod that was Ready before the claim,
	// e.g. "0.985"; empty without claims in that minute.
	// +optional
	WarmHitRatio string `json:"warmHitRatio,omitempty"`

	// startupSeconds is how long the pool's pods take from creation to
	// Ready: the moving mean of the recent ones plus their mean deviation,
	// e.g. "2.5"; empty until one became Ready under this manager.
	// +optional
	StartupSeconds string `json:"startupSeconds,omitempty"`

	// selector is the label selector of the pool's pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// observedGeneration is the generation of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// autoscaling is the last decision of spec.autoscaling.
	// +optional
	Autoscaling *PoolAutoscalingStatus `json:"autoscaling,omitempty"`

	// tenants is what each namespace using a shared pool holds and waits for,
	// those holding the most first (at most 100).
	// +listType=map
	// +listMapKey=namespace
	// +optional
	Tenants []TenantUsage `json:"tenants,omitempty"`

	// conditions: Ready (the pool has its idle replicas), Degraded (pods
	// cannot start, with a reason such as ImagePullBackOff) and
	// NetworkPolicyReady (the pool's NetworkPolicy is in place).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxPool keeps a number of warm Python sandbox pods ready for Executions.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=sbp,categories=warmpool
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`,description="Desired idle pods"
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Idle",type=integer,JSONPath=`.status.idleReplicas`
// +kubebuilder:printcolumn:name="Busy",type=integer,JSONPath=`.status.busyReplicas`
// +kubebuilder:printcolumn:name="Up-to-date",type=integer,JSONPath=`.status.updatedReplicas`,description="Unclaimed pods of the current template"
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why the pool is or is not Ready"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type SandboxPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the pool.
	// +required
	Spec SandboxPoolSpec `json:"spec"`

	// status is the observed state of the pool.
	// +optional
	Status SandboxPoolStatus `json:"status,omitempty"`
}

// SandboxPoolList contains a list of SandboxPool.
// +kubebuilder:object:root=true
type SandboxPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SandboxPool{}, &SandboxPoolList{})
}
