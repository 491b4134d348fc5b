// Package wrappers builds API objects for tests in a readable, chainable way:
//
//	wrappers.Execution("ns", "hello").Pool("python").Code("print(1)").Obj()
package wrappers

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// PoolWrapper wraps a SandboxPool.
type PoolWrapper struct{ sandboxv1alpha1.SandboxPool }

// Pool starts a SandboxPool with an image and one replica.
func Pool(namespace, name string) *PoolWrapper {
	return &PoolWrapper{sandboxv1alpha1.SandboxPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: sandboxv1alpha1.SandboxPoolSpec{
			Replicas: 1,
			Image:    "warmpool.dev/repl:test",
		},
	}}
}

// Obj returns a pointer to the built object.
func (w *PoolWrapper) Obj() *sandboxv1alpha1.SandboxPool { return &w.SandboxPool }

// SessionCheckpoint makes the pool's Sessions durable, checkpointed at most every interval.
func (w *PoolWrapper) SessionCheckpoint(interval time.Duration) *PoolWrapper {
	w.Spec.SessionCheckpoint = &sandboxv1alpha1.SessionCheckpointPolicy{Interval: &metav1.Duration{Duration: interval}}
	return w
}

// SessionSuspendAfter sets spec.sessionSuspendAfter.
func (w *PoolWrapper) SessionSuspendAfter(d time.Duration) *PoolWrapper {
	w.Spec.SessionSuspendAfter = &metav1.Duration{Duration: d}
	return w
}

// Replicas sets spec.replicas.
func (w *PoolWrapper) Replicas(n int32) *PoolWrapper { w.Spec.Replicas = n; return w }

// MaxPods sets spec.maxPods.
func (w *PoolWrapper) MaxPods(n int32) *PoolWrapper { w.Spec.MaxPods = &n; return w }

// Image sets spec.image.
func (w *PoolWrapper) Image(image string) *PoolWrapper { w.Spec.Image = image; return w }

// RuntimeClass sets spec.runtimeClassName; "" opts out of gVisor.
func (w *PoolWrapper) RuntimeClass(name string) *PoolWrapper {
	w.Spec.RuntimeClassName = &name
	return w
}

// Preload sets spec.python.preload.
func (w *PoolWrapper) Preload(modules ...string) *PoolWrapper {
	w.Spec.Python.Preload = modules
	return w
}

// Timeout sets spec.executionDefaults.timeout.
func (w *PoolWrapper) Timeout(d time.Duration) *PoolWrapper {
	w.Spec.ExecutionDefaults.Timeout = &metav1.Duration{Duration: d}
	return w
}

// GracePeriod sets spec.executionDefaults.interruptGracePeriod.
// MaxTimeout sets spec.executionDefaults.maxTimeout.
func (w *PoolWrapper) MaxTimeout(d time.Duration) *PoolWrapper {
	w.Spec.ExecutionDefaults.MaxTimeout = &metav1.Duration{Duration: d}
	return w
}

func (w *PoolWrapper) GracePeriod(d time.Duration) *PoolWrapper {
	w.Spec.ExecutionDefaults.InterruptGracePeriod = &metav1.Duration{Duration: d}
	return w
}

// MaxOutputBytes sets spec.executionDefaults.maxOutputBytes.
func (w *PoolWrapper) MaxOutputBytes(n int32) *PoolWrapper {
	w.Spec.ExecutionDefaults.MaxOutputBytes = n
	return w
}

// SessionIdleTimeout sets spec.sessionIdleTimeout.
func (w *PoolWrapper) SessionIdleTimeout(d time.Duration) *PoolWrapper {
	w.Spec.SessionIdleTimeout = &metav1.Duration{Duration: d}
	return w
}

// Memory sets the sandbox container's memory limit and spec.limits.memoryReserve.
func (w *PoolWrapper) Memory(limit, reserve string) *PoolWrapper {
	w.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
	w.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
	q := resource.MustParse(reserve)
	w.Spec.Limits.MemoryReserve = &q
	return w
}

// Processes sets spec.limits.processes.
func (w *PoolWrapper) Processes(n int32) *PoolWrapper {
	w.Spec.Limits.Processes = &n
	return w
}

// LLM makes the pool's Executions ask the named ModelEndpoint in llm_query.
func (w *PoolWrapper) LLM(endpoint string) *PoolWrapper {
	w.Spec.LLM = &sandboxv1alpha1.PoolLLM{Endpoint: endpoint}
	return w
}

// Autoscaling sets spec.autoscaling (target 0.99).
func (w *PoolWrapper) Autoscaling(minReplicas, maxReplicas int32, scaleDownDelay time.Duration) *PoolWrapper {
	w.Spec.Autoscaling = &sandboxv1alpha1.PoolAutoscaling{MinReplicas: minReplicas, MaxReplicas: maxReplicas,
		TargetWarmRatio: "0.99", ScaleDownDelay: &metav1.Duration{Duration: scaleDownDelay}}
	return w
}

// Reuse sets spec.reusePolicy.
func (w *PoolWrapper) Reuse(p sandboxv1alpha1.ReusePolicy) *PoolWrapper {
	w.Spec.ReusePolicy = p
	return w
}

// ExecutionWrapper wraps an Execution.
type ExecutionWrapper struct{ sandboxv1alpha1.Execution }

// Execution starts an Execution of `print(1)` in pool "python".
func Execution(namespace, name string) *ExecutionWrapper {
	return &ExecutionWrapper{sandboxv1alpha1.Execution{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: sandboxv1alpha1.ExecutionSpec{
			PoolRef: sandboxv1alpha1.PoolReference{Name: "python"},
			Code:    ptr.To("print(1)"),
		},
	}}
}

// Obj returns a pointer to the built object.
func (w *ExecutionWrapper) Obj() *sandboxv1alpha1.Execution { return &w.Execution }

// Pool sets spec.poolRef.name.
func (w *ExecutionWrapper) Pool(name string) *ExecutionWrapper { w.Spec.PoolRef.Name = name; return w }

// Code sets spec.code.
func (w *ExecutionWrapper) Code(code string) *ExecutionWrapper { w.Spec.Code = &code; return w }

// NoCode clears spec.code.
func (w *ExecutionWrapper) NoCode() *ExecutionWrapper { w.Spec.Code = nil; return w }

// CodeFromConfigMap sets spec.codeFrom to a ConfigMap key.
func (w *ExecutionWrapper) CodeFromConfigMap(name, key string) *ExecutionWrapper {
	w.Spec.CodeFrom = &sandboxv1alpha1.CodeSource{ConfigMapKeyRef: &sandboxv1alpha1.KeyReference{Name: name, Key: key}}
	return w
}

// CodeFromSecret sets spec.codeFrom to a Secret key.
func (w *ExecutionWrapper) CodeFromSecret(name, key string) *ExecutionWrapper {
	w.Spec.CodeFrom = &sandboxv1alpha1.CodeSource{SecretKeyRef: &sandboxv1alpha1.KeyReference{Name: name, Key: key}}
	return w
}

// Language sets spec.language.
func (w *ExecutionWrapper) Language(l sandboxv1alpha1.Language) *ExecutionWrapper {
	w.Spec.Language = l
	return w
}

// Timeout sets spec.timeout.
func (w *ExecutionWrapper) Timeout(d time.Duration) *ExecutionWrapper {
	w.Spec.Timeout = &metav1.Duration{Duration: d}
	return w
}

// Context sets spec.context as text.
func (w *ExecutionWrapper) Context(text string) *ExecutionWrapper {
	w.Spec.Context = &text
	return w
}

// JSONContext sets spec.context to a JSON document with contextFormat json.
func (w *ExecutionWrapper) JSONContext(doc string) *ExecutionWrapper {
	w.Spec.Context = &doc
	w.Spec.ContextFormat = sandboxv1alpha1.ContextJSON
	return w
}

// Env adds a variable to spec.env.
func (w *ExecutionWrapper) Env(name, value string) *ExecutionWrapper {
	w.Spec.Env = append(w.Spec.Env, sandboxv1alpha1.EnvVar{Name: name, Value: value})
	return w
}

// Session sets spec.session.
func (w *ExecutionWrapper) Session(s string) *ExecutionWrapper { w.Spec.Session = s; return w }

// Owner sets spec.owner.
func (w *ExecutionWrapper) Owner(user string) *ExecutionWrapper { w.Spec.Owner = user; return w }

// Cancel sets spec.cancel.
func (w *ExecutionWrapper) Cancel() *ExecutionWrapper { w.Spec.Cancel = true; return w }

// TTL sets spec.ttlSecondsAfterFinished.
func (w *ExecutionWrapper) TTL(seconds int32) *ExecutionWrapper {
	w.Spec.TTLSecondsAfterFinished = &seconds
	return w
}

// UID sets metadata.uid (objects that never reach an API server need one).
func (w *ExecutionWrapper) UID(uid string) *ExecutionWrapper {
	w.ObjectMeta.UID = types.UID(uid)
	return w
}

// Created sets metadata.creationTimestamp.
func (w *ExecutionWrapper) Created(t time.Time) *ExecutionWrapper {
	w.CreationTimestamp = metav1.NewTime(t)
	return w
}

// RunningOn sets the status of an Execution that claimed pod.
func (w *ExecutionWrapper) RunningOn(pod string) *ExecutionWrapper {
	w.Status.Phase, w.Status.PodName = sandboxv1alpha1.PhaseRunning, pod
	return w
}

// Finished sets a final phase.
func (w *ExecutionWrapper) Finished(phase sandboxv1alpha1.ExecutionPhase) *ExecutionWrapper {
	w.Status.Phase = phase
	return w
}

// PodWrapper wraps a sandbox pod as the pool controller makes them.
type PodWrapper struct{ corev1.Pod }

// Pod starts a Ready, idle, running sandbox pod of pool.
func Pod(namespace, name, pool string) *PodWrapper {
	return &PodWrapper{corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels: map[string]string{sandboxpod.LabelPool: pool, sandboxpod.LabelState: sandboxpod.StateIdle}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}}
}

// Obj returns a pointer to the built object.
func (w *PodWrapper) Obj() *corev1.Pod { return &w.Pod }

// RV sets metadata.resourceVersion.
func (w *PodWrapper) RV(rv string) *PodWrapper { w.ResourceVersion = rv; return w }

// ReadySince sets when the pod became Ready.
func (w *PodWrapper) ReadySince(t time.Time) *PodWrapper {
	for i := range w.Status.Conditions {
		if w.Status.Conditions[i].Type == corev1.PodReady {
			w.Status.Conditions[i].LastTransitionTime = metav1.NewTime(t)
		}
	}
	return w
}

// NotReady clears the Ready condition.
func (w *PodWrapper) NotReady() *PodWrapper {
	w.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	return w
}

// TemplateHash sets the template hash label.
func (w *PodWrapper) TemplateHash(h string) *PodWrapper {
	w.Labels[sandboxpod.LabelTemplateHash] = h
	return w
}

// ClaimedBy writes the claim of ex on the pod, as claim.Claim does.
func (w *PodWrapper) ClaimedBy(ex *sandboxv1alpha1.Execution) *PodWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	w.Labels[sandboxpod.LabelTenant] = ex.Namespace
	if ex.Spec.Session != "" {
		w.Labels[sandboxpod.LabelSession] = ex.Spec.Session
	}
	w.Annotations[sandboxpod.AnnotationClaimedBy] = ex.Name
	w.Annotations[sandboxpod.AnnotationClaimedUID] = string(ex.UID)
	return w
}

// Session marks the pod as held by session s, between its Executions.
func (w *PodWrapper) Session(s string) *PodWrapper {
	w.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	w.Labels[sandboxpod.LabelSession] = s
	return w
}

// SessionTTL sets spec.sessionTTLSecondsAfterFinished.
func (w *PoolWrapper) SessionTTL(seconds int32) *PoolWrapper {
	w.Spec.SessionTTLSecondsAfterFinished = &seconds
	return w
}

func (w *PoolWrapper) ExecutionTTL(seconds int32) *PoolWrapper {
	w.Spec.ExecutionDefaults.TTLSecondsAfterFinished = &seconds
	return w
}

// SessionWrapper wraps a Session.
type SessionWrapper struct{ sandboxv1alpha1.Session }

// Session starts a Session of pool "python".
func Session(namespace, name string) *SessionWrapper {
	return &SessionWrapper{sandboxv1alpha1.Session{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.PoolReference{Name: "python"}},
	}}
}

// Obj returns a pointer to the built object.
func (w *SessionWrapper) Obj() *sandboxv1alpha1.Session { return &w.Session }

// Pool sets spec.poolRef.name.
func (w *SessionWrapper) Pool(name string) *SessionWrapper { w.Spec.PoolRef.Name = name; return w }

// UID sets metadata.uid (objects not sent to an API server).
func (w *SessionWrapper) UID(uid string) *SessionWrapper { w.ObjectMeta.UID = types.UID(uid); return w }

// Created sets metadata.creationTimestamp.
func (w *SessionWrapper) Created(t time.Time) *SessionWrapper {
	w.CreationTimestamp = metav1.NewTime(t)
	return w
}

// TTL sets spec.ttlSecondsAfterFinished.
func (w *SessionWrapper) TTL(seconds int32) *SessionWrapper {
	w.Spec.TTLSecondsAfterFinished = &seconds
	return w
}

// Owner sets spec.owner.
func (w *SessionWrapper) Owner(user string) *SessionWrapper { w.Spec.Owner = user; return w }

// OwnerOnly binds the Session to its owner (spec.access Owner).
func (w *SessionWrapper) OwnerOnly() *SessionWrapper {
	w.Spec.Access = sandboxv1alpha1.SessionAccessOwner
	return w
}

// IdleTimeout sets spec.idleTimeout.
func (w *SessionWrapper) IdleTimeout(d time.Duration) *SessionWrapper {
	w.Spec.IdleTimeout = &metav1.Duration{Duration: d}
	return w
}

// Checkpoint makes the Session durable, checkpointed at most every interval (0: after every run).
func (w *SessionWrapper) Checkpoint(interval time.Duration) *SessionWrapper {
	w.Spec.Checkpoint = &sandboxv1alpha1.SessionCheckpointPolicy{Interval: &metav1.Duration{Duration: interval}}
	return w
}

// MaxLifetime sets spec.maxLifetime.
func (w *SessionWrapper) MaxLifetime(d time.Duration) *SessionWrapper {
	w.Spec.MaxLifetime = &metav1.Duration{Duration: d}
	return w
}

// Context sets spec.context (text).
func (w *SessionWrapper) Context(text string) *SessionWrapper { w.Spec.Context = &text; return w }

// ContextJSON sets a context the interpreter parses as JSON.
func (w *SessionWrapper) ContextJSON(doc string) *SessionWrapper {
	w.Spec.Context, w.Spec.ContextFormat = &doc, sandboxv1alpha1.ContextJSON
	return w
}

// Env adds a variable to spec.env.
func (w *SessionWrapper) Env(name, value string) *SessionWrapper {
	w.Spec.Env = append(w.Spec.Env, sandboxv1alpha1.EnvVar{Name: name, Value: value})
	return w
}

// ReadyOn sets the status of a Session that holds pod.
func (w *SessionWrapper) ReadyOn(pod string) *SessionWrapper {
	w.Status.Phase, w.Status.PodName = sandboxv1alpha1.SessionReady, pod
	return w
}

// Closed ends the Session Closed (it keeps the pod its status names).
func (w *SessionWrapper) Closed() *SessionWrapper {
	w.Status.Phase = sandboxv1alpha1.SessionClosed
	return w
}

// HeldBy labels the pod as Session ses's, as its claim does.
func (w *PodWrapper) HeldBy(ses *sandboxv1alpha1.Session) *PodWrapper {
	w.Session(ses.Name)
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[sandboxpod.AnnotationSessionUID] = string(ses.UID)
	w.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
	w.Labels[sandboxpod.LabelTenant] = ses.Namespace
	return w
}

// Tenant marks the pod as having run namespace ns's code (an idle reused pod
// of a shared pool).
func (w *PodWrapper) Tenant(ns string) *PodWrapper {
	w.Labels[sandboxpod.LabelTenant] = ns
	return w
}

// Shared shares the pool with the namespaces labelled with selector, each
// within limits.
func (w *PoolWrapper) Shared(selector map[string]string, limits sandboxv1alpha1.TenantLimits) *PoolWrapper {
	w.Spec.Sharing = &sandboxv1alpha1.PoolSharing{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: selector}, Limits: limits}
	return w
}

// Reserve keeps n idle pods of the shared pool for tenants that hold none.
func (w *PoolWrapper) Reserve(n int32) *PoolWrapper {
	w.Spec.Sharing.ReservedIdlePods = n
	return w
}

// TenantWeight gives namespace ns a weight on the shared pool.
func (w *PoolWrapper) TenantWeight(ns string, weight int32) *PoolWrapper {
	w.Spec.Sharing.Tenants = append(w.Spec.Sharing.Tenants, sandboxv1alpha1.TenantPolicy{Namespace: ns, Weight: weight})
	return w
}

// SharedPool points the Execution at pool name of namespace ns.
func (w *ExecutionWrapper) SharedPool(ns, name string) *ExecutionWrapper {
	w.Spec.PoolRef = sandboxv1alpha1.PoolReference{Namespace: ns, Name: name}
	return w
}

// SharedPool points the Session at pool name of namespace ns.
func (w *SessionWrapper) SharedPool(ns, name string) *SessionWrapper {
	w.Spec.PoolRef = sandboxv1alpha1.PoolReference{Namespace: ns, Name: name}
	return w
}
