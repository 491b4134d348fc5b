package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Language of an Execution's code.
// +kubebuilder:validation:Enum=python;shell
type Language string

const (
	// LanguagePython runs the code in the pod's warm Python interpreter.
	LanguagePython Language = "python"
	// LanguageShell runs the code with /bin/sh -c in the pod's workspace.
	LanguageShell Language = "shell"
)

// ContextFormat says how an Execution's context reaches the code.
// +kubebuilder:validation:Enum=text;json
type ContextFormat string

const (
	// ContextText hands the context to the code as a str.
	ContextText ContextFormat = "text"
	// ContextJSON parses the context as JSON before the code runs.
	ContextJSON ContextFormat = "json"
)

// ExecutionPhase is where an Execution is in its lifecycle.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;TimedOut;Cancelled
type ExecutionPhase string

const (
	// PhasePending: waiting for a pod of the pool.
	PhasePending ExecutionPhase = "Pending"
	// PhaseRunning: the code runs in a pod.
	PhaseRunning ExecutionPhase = "Running"
	// PhaseSucceeded: the code finished without an exception (or, for shell, with exit code 0).
	PhaseSucceeded ExecutionPhase = "Succeeded"
	// PhaseFailed: the code raised, exited non-zero, or could not run (see status.error and conditions).
	PhaseFailed ExecutionPhase = "Failed"
	// PhaseTimedOut: the code was interrupted at its timeout.
	PhaseTimedOut ExecutionPhase = "TimedOut"
	// PhaseCancelled: spec.cancel was set before the code finished.
	PhaseCancelled ExecutionPhase = "Cancelled"
)

// IsFinished reports whether the phase is terminal.
func (p ExecutionPhase) IsFinished() bool {
	switch p {
	case PhaseSucceeded, PhaseFailed, PhaseTimedOut, PhaseCancelled:
		return true
	}
	return false
}

// Limits of an Execution's spec. Together with MaxOutputBytesLimit they keep
// an Execution object well below etcd's 1.5 MiB limit.
const (
	// MaxCodeBytes bounds spec.code.
	MaxCodeBytes = 131072
	// MaxTimeout bounds spec.timeout and the pools' default timeout.
	MaxTimeout = "24h"
	// MaxContextBytes bounds spec.context.
	MaxContextBytes = 262144
	// MaxResultBytes bounds status.result; a longer value is cut.
	MaxResultBytes = 65536
)

// PoolReference names a SandboxPool: in the object's own namespace, or a
// shared pool (spec.sharing) in a namespace the platform owns.
type PoolReference struct {
	// name of the SandboxPool.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`

	// namespace of a shared SandboxPool whose spec.sharing admits this
	// object's namespace. Unset: the pool is in this object's namespace.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="poolRef.namespace must be a namespace name (lowercase letters, digits and '-')"
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// Key returns the pool's name and namespace for an object in namespace own.
func (r PoolReference) Key(own string) types.NamespacedName {
	if r.Namespace != "" {
		return types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
	}
	return types.NamespacedName{Namespace: own, Name: r.Name}
}

// Shared reports whether the reference crosses namespaces from own.
func (r PoolReference) Shared(own string) bool { return r.Namespace != "" && r.Namespace != own }

// ParsePoolReference reads "name" (a pool of the object's own namespace) or
// "namespace/name" (a shared pool), the form clients and the data plane take.
func ParsePoolReference(s string) PoolReference {
	if ns, name, ok := strings.Cut(s, "/"); ok {
		return PoolReference{Namespace: ns, Name: name}
	}
	return PoolReference{Name: s}
}

// String is "name" for a pool of the object's namespace, "namespace/name" otherwise.
func (r PoolReference) String() string {
	if r.Namespace != "" {
		return r.Namespace + "/" + r.Name
	}
	return r.Name
}

// PoolKey is the Execution's pool.
func (ex *Execution) PoolKey() types.NamespacedName { return ex.Spec.PoolRef.Key(ex.Namespace) }

// PodKey is the Execution's pod (status.podName), which lives in its pool's namespace.
func (ex *Execution) PodKey() types.NamespacedName {
	return types.NamespacedName{Namespace: ex.PoolKey().Namespace, Name: ex.Status.PodName}
}

// KeyReference names a key of a ConfigMap or Secret in the Execution's namespace.
type KeyReference struct {
	// name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// key within the object's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Key string `json:"key"`
}

// LabelCodeSource marks a ConfigMap or Secret whose owner lets Executions read
// it as code (value "true"). The operator reads no other: being allowed to
// create Executions must not mean being able to read every Secret of the
// namespace back through a run's output.
const LabelCodeSource = "sandbox.warmpool.dev/code"

// CodeSource reads the code from a ConfigMap or a Secret. Exactly one is set,
// and the object must carry the label sandbox.warmpool.dev/code: "true".
// +kubebuilder:validation:XValidation:rule="has(self.configMapKeyRef) != has(self.secretKeyRef)",message="spec.codeFrom needs exactly one of configMapKeyRef or secretKeyRef"
type CodeSource struct {
	// configMapKeyRef reads the code from a key of a ConfigMap.
	// +optional
	ConfigMapKeyRef *KeyReference `json:"configMapKeyRef,omitempty"`
	// secretKeyRef reads the code from a key of a Secret.
	// +optional
	SecretKeyRef *KeyReference `json:"secretKeyRef,omitempty"`
}

// EnvVar is an environment variable set in the interpreter for one Execution.
type EnvVar struct {
	// name of the variable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +required
	Name string `json:"name"`
	// value of the variable.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Value string `json:"value"`
}

// ExecutionSpec is what to run and where. It cannot change after creation,
// except cancel and ttlSecondsAfterFinished.
// +kubebuilder:validation:XValidation:rule="has(self.code) != has(self.codeFrom)",message="exactly one of spec.code or spec.codeFrom must be set"
// +kubebuilder:validation:XValidation:rule="has(self.code) == has(oldSelf.code) && has(self.codeFrom) == has(oldSelf.codeFrom) && has(self.timeout) == has(oldSelf.timeout) && has(self.context) == has(oldSelf.context) && has(self.env) == has(oldSelf.env) && has(self.session) == has(oldSelf.session) && has(self.owner) == has(oldSelf.owner)",message="spec is immutable except cancel and ttlSecondsAfterFinished: create a new Execution instead"
type ExecutionSpec struct {
	// poolRef names the SandboxPool whose pod runs the code: one in this
	// namespace, or a shared pool of another namespace that admits this one.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.poolRef is immutable"
	// +required
	PoolRef PoolReference `json:"poolRef"`

	// code to run. Python: a trailing expression's repr becomes status.result.
	// Shell: run with /bin/sh -c.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=131072
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.code is immutable: create a new Execution to run other code"
	// +optional
	Code *string `json:"code,omitempty"`

	// codeFrom reads the code from a ConfigMap or Secret key instead of spec.code.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.codeFrom is immutable"
	// +optional
	CodeFrom *CodeSource `json:"codeFrom,omitempty"`

	// language of the code: python (default) or shell.
	// +kubebuilder:default=python
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.language is immutable"
	// +optional
	Language Language `json:"language,omitempty"`

	// timeout of the run, counted from status.startTime. At the timeout the code
	// gets KeyboardInterrupt (SIGINT) and the Execution ends TimedOut. Defaults
	// to the pool's spec.executionDefaults.timeout.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('24h')",message="spec.timeout must be greater than 0s and at most 24h"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.timeout is immutable"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// context is handed to the code as the Python variable `context`: a str, or,
	// with contextFormat json, the parsed JSON value (dict, list, ...).
	// +kubebuilder:validation:MaxLength=262144
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.context is immutable"
	// +optional
	Context *string `json:"context,omitempty"`

	// contextFormat says how to read context: text (default) or json.
	// +kubebuilder:default=text
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.contextFormat is immutable"
	// +optional
	ContextFormat ContextFormat `json:"contextFormat,omitempty"`

	// env is set in the interpreter (os.environ) for this run only.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.env is immutable"
	// +optional
	Env []EnvVar `json:"env,omitempty"`

	// session groups Executions that run one at a time, in creation order, on
	// one pod whose interpreter keeps its state (variables, imports) between them.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.session is immutable"
	// +optional
	Session string `json:"session,omitempty"`

	// owner is the user who created the Execution, as kube-apiserver
	// authenticated them (kubectl auth whoami). The clients fill it in; the
	// ValidatingAdmissionPolicy warmpool-owner refuses an Execution whose
	// owner is anyone but the user creating it. An Execution may run in a
	// Session with access Owner only when it names the Session's owner here.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.owner is immutable"
	// +optional
	Owner string `json:"owner,omitempty"`

	// cancel stops the Execution: a pending one never runs, a running one is
	// interrupted. It ends Cancelled.
	// +optional
	Cancel bool `json:"cancel,omitempty"`

	// ttlSecondsAfterFinished deletes the Execution this long after it finished.
	// Unset: the pool's executionDefaults.ttlSecondsAfterFinished (one hour
	// unless the pool says otherwise), so finished Executions do not pile up in etcd.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// ExecutionResult is one rich result of an Execution, without its content.
type ExecutionResult struct {
	// mimeTypes the result came in, e.g. ["text/plain", "image/png"].
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MimeTypes []string `json:"mimeTypes"`
	// text is its text/plain form, cut to 1 KiB.
	// +optional
	Text string `json:"text,omitempty"`
	// main is true for the code's last expression.
	// +optional
	Main bool `json:"main,omitempty"`
}

// ExecutionFile is a file of the workspace an Execution created or changed.
type ExecutionFile struct {
	// path from the workspace's root.
	Path string `json:"path"`
	// size in bytes.
	Size int64 `json:"size"`
}

// Limits of an Execution's results in its status.
const (
	MaxStatusResults    = 32
	MaxStatusResultText = 1024
	MaxStatusFiles      = 32
)

// ExecutionError describes why the code failed.
type ExecutionError struct {
	// type is the exception class (e.g. ZeroDivisionError), or an operator
	// reason such as SandboxLost when the code could not run to its end.
	// +optional
	Type string `json:"type,omitempty"`
	// message of the exception.
	// +optional
	Message string `json:"message,omitempty"`
	// traceback of the exception, with line numbers of the user's code.
	// +optional
	Traceback string `json:"traceback,omitempty"`
}

// PodDisposition is what happens to an Execution's pod after its final status.
// +kubebuilder:validation:Enum=Delete;ReleaseToSession;Reset
type PodDisposition string

const (
	// DispositionDelete deletes the pod; the pool replaces it.
	DispositionDelete PodDisposition = "Delete"
	// DispositionReleaseToSession keeps the pod and its interpreter for the session's next Execution.
	DispositionReleaseToSession PodDisposition = "ReleaseToSession"
	// DispositionReset replaces the interpreter and returns the pod to the pool (reusePolicy FreshInterpreter).
	DispositionReset PodDisposition = "Reset"
)

// ExecutionStatus is the observed state of an Execution.
type ExecutionStatus struct {
	// phase: Pending, Running, Succeeded, Failed, TimedOut or Cancelled.
	// +optional
	Phase ExecutionPhase `json:"phase,omitempty"`

	// sessionResumed: the Execution's Session was Suspended, and was resumed
	// (its state restored on a warm pod) for this Execution.
	// +optional
	SessionResumed bool `json:"sessionResumed,omitempty"`

	// podName of the sandbox pod that runs or ran the code.
	// +optional
	PodName string `json:"podName,omitempty"`

	// podUID is the UID of the pod named in podName, recorded with the
	// claim: every later step (following the run after a manager restart,
	// the pod's disposition) acts only on that pod, never on another made
	// later under its name.
	// +optional
	PodUID types.UID `json:"podUID,omitempty"`

	// startTime is when the code started in the pod.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the Execution finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// durationMillis is how long the code ran, in milliseconds.
	// +optional
	DurationMillis *int64 `json:"durationMillis,omitempty"`

	// duration is durationMillis for people, e.g. "12ms" or "1.5s".
	// +optional
	Duration string `json:"duration,omitempty"`

	// stdout of the code, cut to the pool's maxOutputBytes with a notice.
	// +optional
	Stdout string `json:"stdout,omitempty"`

	// stdoutTruncated is true when stdout was cut.
	// +optional
	StdoutTruncated bool `json:"stdoutTruncated,omitempty"`

	// stderr of the code, cut to the pool's maxOutputBytes with a notice.
	// +optional
	Stderr string `json:"stderr,omitempty"`

	// stderrTruncated is true when stderr was cut.
	// +optional
	StderrTruncated bool `json:"stderrTruncated,omitempty"`

	// result is the FINAL() value, or the repr of the code's last expression.
	// +optional
	Result string `json:"result,omitempty"`

	// error says why the code failed.
	// +optional
	Error *ExecutionError `json:"error,omitempty"`

	// exitCode of a shell Execution.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`

	// results are the code's rich results (charts, tables, display(obj)) in
	// order: each one's MIME types and its text/plain form. Their content (a
	// PNG, HTML) is not kept here, since etcd is no place for images: run
	// the code in a Session (the SDKs, kubectl warmpool run --save-results)
	// to get it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Results []ExecutionResult `json:"results,omitempty"`

	// files the code created or changed in the workspace, at most 32.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Files []ExecutionFile `json:"files,omitempty"`

	// codeDigest is the SHA-256 of the code that started ("sha256:<hex>"), so
	// a restarted manager never runs other code under this Execution's name
	// (spec.codeFrom can change) and a reader can tell which code ran.
	// +optional
	CodeDigest string `json:"codeDigest,omitempty"`

	// interpreter identifies the interpreter process that ran the code. The
	// session's next Execution runs only on that same process: if it died or
	// was replaced in between, the session's state is gone and the next
	// Execution ends SessionLost instead of running on an empty interpreter.
	// +optional
	Interpreter string `json:"interpreter,omitempty"`

	// podDisposition is what the manager does with the pod once the final
	// status is stored: Delete it, ReleaseToSession (the session's next
	// Execution runs on it), or Reset (a fresh interpreter, then back to the
	// pool). The pod is touched only after this is recorded, so a manager that
	// stops in between carries it out when it comes back.
	// +optional
	PodDisposition PodDisposition `json:"podDisposition,omitempty"`

	// observedGeneration is the generation of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: WaitingForSandbox while no pod is free; Complete once finished,
	// with a reason such as Succeeded, TimedOut, SandboxLost or CodeSourceNotFound.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Execution runs a piece of code in a warm sandbox pod of a SandboxPool.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ex,categories=warmpool
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Session",type=string,JSONPath=`.spec.session`,priority=1
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Duration",type=string,JSONPath=`.status.duration`
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.podName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`,priority=1
type Execution struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the code to run and where.
	// +required
	Spec ExecutionSpec `json:"spec"`

	// status is the outcome.
	// +optional
	Status ExecutionStatus `json:"status,omitempty"`
}

// ExecutionList contains a list of Execution.
// +kubebuilder:object:root=true
type ExecutionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Execution `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Execution{}, &ExecutionList{})
}
