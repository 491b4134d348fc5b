package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AnnotationCreatedFor is set on a Session the manager created for an
// Execution that named it in spec.session; it names that Execution.
const AnnotationCreatedFor = "sandbox.warmpool.dev/created-for"

// AnnotationRun is set on a Session the data plane created for a one-call
// run (POST data.warmpool.dev/.../runs); it names that run's ID, which the
// Session's owner can ask about (sessions/executions) if the answer was lost.
const AnnotationRun = "sandbox.warmpool.dev/run"

// AnnotationClaimedPod is set on the Session of a one-call run whose pod
// the data plane claimed itself, at the same time as it created the Session:
// the Session is leased that pod alone (the manager adopts it) until the
// annotation goes or is older than a few seconds.
const AnnotationClaimedPod = "sandbox.warmpool.dev/claimed-pod"

// AnnotationRestoring is set on a Session that waits for its state from a
// snapshot: a fork of the Session it names, or (any value) a caller's own
// snapshot it sends to sessions/NAME/restore. No code runs in the Session
// until that restore clears it, so a fork whose copy failed never passes for
// a copy.
const AnnotationRestoring = "sandbox.warmpool.dev/restoring"

// AnnotationForkedFrom names the Session a fork copied.
const AnnotationForkedFrom = "sandbox.warmpool.dev/forked-from"

// AnnotationResume asks the manager to resume a Suspended Session; its
// value is the status.snapshot.key to resume from (so a request left from an
// earlier suspend asks nothing). The data plane sets it for a run, the
// manager for an Execution naming the Session; a user may set it to warm a
// Session up before its next run.
const AnnotationResume = "sandbox.warmpool.dev/resume"

// SessionPhase is where a Session is in its lifecycle.
// +kubebuilder:validation:Enum=Pending;Ready;Suspended;Closed;Lost
type SessionPhase string

const (
	// SessionPending: waiting for a pod of the pool.
	SessionPending SessionPhase = "Pending"
	// SessionReady: the Session holds a pod whose interpreter keeps its state; code runs through the data plane.
	SessionReady SessionPhase = "Ready"
	// SessionSuspended: idle past its suspendAfter, its state was saved to the
	// manager's snapshot store and its pod freed; its next run resumes it on
	// a warm pod, with its state.
	SessionSuspended SessionPhase = "Suspended"
	// SessionClosed: ended by its idle timeout, its maximum lifetime, or spec.close; the pod was freed.
	SessionClosed SessionPhase = "Closed"
	// SessionLost: its pod or interpreter went away (see conditions); the state is gone.
	SessionLost SessionPhase = "Lost"
)

// ResumeRequested reports whether a Suspended Session was asked to resume:
// AnnotationResume names the snapshot its status holds.
func (s *Session) ResumeRequested() bool {
	return s.Status.Phase == SessionSuspended && s.Status.Snapshot != nil && s.Status.Snapshot.Key != "" &&
		(s.Annotations[AnnotationResume] == s.Status.Snapshot.Key || s.Moving())
}

// Moving reports whether the Session was suspended to move off a drained
// node: it resumes at once, asked or not.
func (s *Session) Moving() bool {
	return s.Status.Phase == SessionSuspended && s.Status.LastMove != nil && s.Status.LastMove.EndTime == nil
}

// IsFinished reports whether the phase is terminal.
func (p SessionPhase) IsFinished() bool { return p == SessionClosed || p == SessionLost }

// SessionAccess says who may use a Session's interpreter.
// +kubebuilder:validation:Enum=Namespace;Owner
type SessionAccess string

const (
	// SessionAccessNamespace: whoever RBAC lets use the namespace's Sessions
	// (sessions/exec and the other subresources of data.warmpool.dev, or
	// creating Executions), as pods/exec does for pods.
	SessionAccessNamespace SessionAccess = "Namespace"
	// SessionAccessOwner: only spec.owner, through the data plane and as
	// Executions whose spec.owner is that user.
	SessionAccessOwner SessionAccess = "Owner"
)

// SessionSpec is a lease on one warm interpreter of a pool.
// +kubebuilder:validation:XValidation:rule="has(self.context) == has(oldSelf.context) && has(self.env) == has(oldSelf.env) && has(self.owner) == has(oldSelf.owner)",message="spec is immutable except close, idleTimeout and maxLifetime: create a new Session instead"
// +kubebuilder:validation:XValidation:rule="!has(self.access) || self.access != 'Owner' || has(self.owner)",message="spec.access Owner binds the Session to spec.owner: set spec.owner to your user name (kubectl auth whoami)"
type SessionSpec struct {
	// poolRef names the SandboxPool whose pod the Session leases: one in the
	// Session's namespace, or a shared pool of another namespace that admits this one.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.poolRef is immutable"
	PoolRef PoolReference `json:"poolRef"`

	// idleTimeout ends the Session this long after its last run; the pool's
	// sessionIdleTimeout when unset.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="spec.idleTimeout must be between 1s and 24h"
	// +optional
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// ttlSecondsAfterFinished deletes the Session this long after it ended
	// (Closed or Lost); the pool's sessionTTLSecondsAfterFinished when unset.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// maxLifetime ends the Session this long after it became Ready, however
	// busy; unlimited when unset.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="spec.maxLifetime must be between 1s and 168h"
	// +optional
	MaxLifetime *metav1.Duration `json:"maxLifetime,omitempty"`

	// suspendAfter suspends the Session once it is idle this long (its state
	// saved, its pod freed; its next run resumes it); the pool's
	// sessionSuspendAfter when unset; 0s never suspends it. Takes effect only
	// with a snapshot store in the manager's configuration and when shorter
	// than the idle timeout.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="spec.suspendAfter must be between 0s (never) and 24h"
	// +optional
	SuspendAfter *metav1.Duration `json:"suspendAfter,omitempty"`

	// context is set as the Python variable `context` once, when the Session
	// becomes Ready.
	// +kubebuilder:validation:MaxLength=262144
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.context is immutable"
	// +optional
	Context *string `json:"context,omitempty"`

	// contextFormat says whether context is text or JSON to parse.
	// +kubebuilder:default=text
	// +optional
	ContextFormat ContextFormat `json:"contextFormat,omitempty"`

	// env is set in the interpreter's environment once, when the Session becomes Ready.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.env is immutable"
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`

	// owner is the user who created the Session, as kube-apiserver
	// authenticated them (kubectl auth whoami). The clients fill it in; the
	// ValidatingAdmissionPolicy warmpool-owner refuses a Session whose owner
	// is anyone but the user creating it. Unset: nobody was recorded (a
	// manifest without it, or a Session the manager made for an Execution,
	// which its created-for annotation names).
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.owner is immutable"
	// +optional
	Owner string `json:"owner,omitempty"`

	// access: Namespace (default), anyone who may use the namespace's
	// Sessions; Owner, spec.owner alone: the data plane answers anyone else
	// 403, and an Execution naming the Session fails unless its spec.owner is
	// the same user. Deleting or closing the Session stays with RBAC.
	// +kubebuilder:default=Namespace
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.access is immutable"
	// +optional
	Access SessionAccess `json:"access,omitempty"`

	// close ends the Session now (Closed): its pod is freed once no Execution
	// holds it, and data-plane runs in flight end with it.
	// +optional
	Close bool `json:"close,omitempty"`

	// checkpoint makes the Session durable: its state is saved to the
	// manager's snapshot store after its runs (off their path: a run's
	// answer never waits for it), and a Session whose pod or node is lost
	// resumes from its last checkpoint instead of ending Lost; the next run's
	// result says which run its state is from. The pool's sessionCheckpoint
	// when unset. Needs a snapshot store in the manager's configuration.
	// +optional
	Checkpoint *SessionCheckpointPolicy `json:"checkpoint,omitempty"`
}

// SessionCheckpointPolicy says how often a durable Session's state is saved.
type SessionCheckpointPolicy struct {
	// interval is the least time between two checkpoints: the state after
	// the last run is saved when the interval has passed. 0s (the default):
	// after every run.
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="checkpoint.interval must be between 0s (after every run) and 24h"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// SessionMove is a Session's move off a drained node.
type SessionMove struct {
	// fromNode is the node the Session left, and why (cordoned, tainted).
	FromNode string `json:"fromNode"`
	// reason the node was left: the node's cordon or taint.
	// +optional
	Reason string `json:"reason,omitempty"`
	// toNode is the node of the pod it resumed on ("" until it did).
	// +optional
	ToNode string `json:"toNode,omitempty"`
	// startTime is when it began to leave its pod (its state was being saved).
	StartTime metav1.Time `json:"startTime"`
	// endTime is when it was Ready on the new pod; unset while it moves.
	// +optional
	EndTime *metav1.Time `json:"endTime,omitempty"`
	// pauseMillis is how long it moved: from startTime to endTime, the time
	// a run sent to it waited.
	// +optional
	PauseMillis int64 `json:"pauseMillis,omitempty"`
	// checkpoint is set when the Session's pod or node was lost and it
	// resumed from its last checkpoint: the runs after checkpoint.run are
	// not in its state.
	// +optional
	Checkpoint *SessionSnapshot `json:"checkpoint,omitempty"`
}

// SessionStatus is what the manager observed.
type SessionStatus struct {
	// phase is Pending, Ready, Closed or Lost.
	// +optional
	Phase SessionPhase `json:"phase,omitempty"`

	// podName is the pod the Session holds (or held).
	// +optional
	PodName string `json:"podName,omitempty"`

	// podUID is the UID of the pod named in podName: a pod made later under
	// that name, however it is labelled, is not the Session's.
	// +optional
	PodUID types.UID `json:"podUID,omitempty"`

	// interpreter identifies the interpreter that keeps the Session's state; a
	// run that finds another one fails rather than continue on a fresh one.
	// +optional
	Interpreter string `json:"interpreter,omitempty"`

	// readyTime is when the Session became Ready.
	// +optional
	ReadyTime *metav1.Time `json:"readyTime,omitempty"`

	// lastActivityTime is when the last run ended, written at most every few
	// seconds (never once per run); the idle timeout counts from it.
	// +optional
	LastActivityTime *metav1.Time `json:"lastActivityTime,omitempty"`

	// endTime is when the Session ended (Closed or Lost); its TTL counts from it.
	// +optional
	EndTime *metav1.Time `json:"endTime,omitempty"`

	// runs counts the runs of the Session as of lastActivityTime.
	// +optional
	Runs int64 `json:"runs,omitempty"`

	// resumes counts the times the Session was resumed from a snapshot.
	// +optional
	Resumes int32 `json:"resumes,omitempty"`

	// moves counts the times the Session moved to another node because its
	// node was drained.
	// +optional
	Moves int32 `json:"moves,omitempty"`

	// lastMove is the Session's last move off a drained node.
	// +optional
	LastMove *SessionMove `json:"lastMove,omitempty"`

	// suspendTime is when the Session was last suspended.
	// +optional
	SuspendTime *metav1.Time `json:"suspendTime,omitempty"`

	// snapshot is the saved state a Suspended Session resumes from.
	// +optional
	Snapshot *SessionSnapshot `json:"snapshot,omitempty"`

	// checkpoint is a durable Session's last checkpoint known to the
	// manager, written at most every few seconds with its activity (the
	// store may hold a newer one, which a recovery uses).
	// +optional
	Checkpoint *SessionSnapshot `json:"checkpoint,omitempty"`

	// conditions: Ready, with a reason that says why not (NoIdleSandbox,
	// PoolNotFound, SandboxLost, InterpreterRestarted, IdleTimeout, ...).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SessionSnapshot is a snapshot of a Session in the manager's snapshot store:
// encrypted with the manager's key, bound to the Session's namespace and UID.
type SessionSnapshot struct {
	// key of the object in the store.
	// +kubebuilder:validation:MaxLength=1024
	Key string `json:"key"`
	// bytes of the snapshot (before encryption).
	Bytes int64 `json:"bytes"`
	// variables saved.
	// +optional
	Variables int32 `json:"variables,omitempty"`
	// skipped names the variables that could not be saved (sockets,
	// threads, generators, open files), at most 32: they are not there after
	// a resume.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Skipped []string `json:"skipped,omitempty"`
	// workspaceFiles saved with it.
	// +optional
	WorkspaceFiles int32 `json:"workspaceFiles,omitempty"`
	// time the snapshot was taken.
	Time metav1.Time `json:"time"`
	// run is the Session's number of runs the state is as of.
	// +optional
	Run int64 `json:"run,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ses,categories=warmpool
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="a Session's name must be at most 63 characters: it labels the Session's pod"
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Pool Namespace",type=string,JSONPath=`.spec.poolRef.namespace`,priority=1
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.podName`
// +kubebuilder:printcolumn:name="Last activity",type=date,JSONPath=`.status.lastActivityTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`,priority=1
// +kubebuilder:printcolumn:name="Access",type=string,JSONPath=`.spec.access`,priority=1
// +kubebuilder:printcolumn:name="Resumes",type=integer,JSONPath=`.status.resumes`,priority=1
// +kubebuilder:printcolumn:name="Moves",type=integer,JSONPath=`.status.moves`,priority=1
// +kubebuilder:printcolumn:name="Checkpoint",type=integer,JSONPath=`.status.checkpoint.run`,priority=1

// Session leases one warm interpreter of a SandboxPool; code runs in it
// through the data plane (data.warmpool.dev) or as Executions naming it.
type Session struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SessionSpec   `json:"spec"`
	Status SessionStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SessionList is a list of Sessions.
type SessionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Session `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Session{}, &SessionList{})
}

// PoolKey is the Session's pool.
func (s *Session) PoolKey() types.NamespacedName { return s.Spec.PoolRef.Key(s.Namespace) }

// PodKey is the Session's pod (status.podName), which lives in its pool's namespace.
func (s *Session) PodKey() types.NamespacedName {
	return types.NamespacedName{Namespace: s.PoolKey().Namespace, Name: s.Status.PodName}
}
