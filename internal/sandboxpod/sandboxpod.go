// Package sandboxpod builds the pods of a SandboxPool and names the labels and
// annotations that carry a pod's state. The security defaults of every sandbox
// live here, in one place.
package sandboxpod

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Labels and annotations on sandbox pods.
const (
	// LabelPool names the pod's SandboxPool.
	LabelPool = "sandbox.warmpool.dev/pool"
	// LabelState is StateIdle, StateBusy or StateResetting.
	LabelState = "sandbox.warmpool.dev/state"
	// LabelTemplateHash identifies the pool spec the pod was built from.
	LabelTemplateHash = "sandbox.warmpool.dev/template-hash"
	// LabelSession names the session that holds the pod.
	LabelSession = "sandbox.warmpool.dev/session"
	// LabelTenant is the namespace whose code the pod ran (written with its
	// first claim, never changed): in a shared pool the pod serves that
	// namespace alone from then on.
	LabelTenant = "sandbox.warmpool.dev/tenant"

	// AnnotationSessionUID is the UID of the Session object whose pod it is: a
	// later Session of the same name is another Session and never adopts it.
	AnnotationSessionUID = "sandbox.warmpool.dev/session-uid"
	// AnnotationClaimedBy is the name of the Execution that runs on the pod.
	AnnotationClaimedBy = "sandbox.warmpool.dev/claimed-by"
	// AnnotationClaimedUID is the UID of that Execution.
	AnnotationClaimedUID = "sandbox.warmpool.dev/claimed-uid"
	// AnnotationLastUsed is when the last Execution on the pod finished (RFC 3339), for session idle timeouts.
	AnnotationLastUsed = "sandbox.warmpool.dev/last-used"
	// AnnotationInterpreter is, on a session's pod, the interpreter that ran the
	// session's last Execution: the next one runs only on it.
	AnnotationInterpreter = "sandbox.warmpool.dev/interpreter"
	// AnnotationSuspending marks a Session's pod the manager is suspending the
	// Session from: no Execution may claim it any more (the Session's next
	// Execution resumes it on another pod).
	AnnotationSuspending = "sandbox.warmpool.dev/suspending"
	// AnnotationUsed marks a pod that was claimed at least once: one that fails
	// later is not a start failure of its pool. (Only a FreshInterpreter pool
	// returns a used pod to idle, after replacing its interpreter.)
	AnnotationUsed = "sandbox.warmpool.dev/used"
	// LabelAgentKey is the ID of the manager key the pod's agent trusts, so the
	// manager signs the pod's tokens with it (internal/agentauth).
	LabelAgentKey = "sandbox.warmpool.dev/agent-key"
	// LabelAgentClient marks pods allowed to call sandbox agents (the manager),
	// in the namespace the pools' NetworkPolicies name.
	LabelAgentClient = "sandbox.warmpool.dev/agent-client"

	// AnnotationRun and AnnotationRunOwner are, on a pod the data plane
	// claimed for a one-call run before its Session had a UID (lease.ClaimForRun),
	// the run's ID and its caller: the Session of that name, run and owner
	// holds the pod until its own UID is written on it.
	AnnotationRun      = "sandbox.warmpool.dev/run"
	AnnotationRunOwner = "sandbox.warmpool.dev/run-owner"

	// AnnotationResetSince is when a pod went into StateResetting (RFC 3339), so a reset that never
	// finished (the manager stopped mid-way) can be told apart from one in progress.
	AnnotationResetSince = "sandbox.warmpool.dev/reset-since"

	StateIdle = "idle"
	StateBusy = "busy"
	// StateResetting: the pod's Execution has ended and its interpreter is being replaced
	// (reusePolicy FreshInterpreter); it goes back to StateIdle when that is done.
	StateResetting = "resetting"

	// ContainerName of the sandbox container.
	ContainerName = "sandbox"
	// AgentPort is where the agent listens in the pod.
	AgentPort = 8080
	// EnvPodUID carries the pod's UID to the agent: the audience of its tokens.
	EnvPodUID = "WARMPOOL_POD_UID"
	// WorkspaceDir is the code's writable working directory.
	WorkspaceDir = "/workspace"
	// TmpDir is the code's other writable directory.
	TmpDir = "/tmp"
	// RunAsUser is the non-root user of sandbox containers.
	RunAsUser = 65532
)

// Defaults applied when the pool's resources leave a limit or request out: every sandbox has limits.
var (
	DefaultCPULimit    = resource.MustParse("1")
	DefaultMemoryLimit = resource.MustParse("512Mi")
	// DefaultCPURequest is an idle warm sandbox's measured CPU (about 1 % of
	// a core with gVisor): the scheduler packs nodes by what a warm pool
	// costs; running code bursts up to its limit.
	DefaultCPURequest     = resource.MustParse("10m")
	DefaultMemoryRequest  = resource.MustParse("128Mi")
	terminationGraceInPod = int64(5)
)

// AgentKey is the manager key a new pod's agent is told to trust.
type AgentKey struct {
	// ID goes into the pod's LabelAgentKey.
	ID string
	// Trusted is the agent's --trusted-keys value: the public key only.
	Trusted string
}

// Selector is the label selector of a pool's pods, as the scale subresource reports it.
func Selector(pool *sandboxv1alpha1.SandboxPool) string {
	return LabelPool + "=" + pool.Name
}

// StartupProbeSeconds is how long a sandbox may take to become ready.
const StartupProbeSeconds = 600

// builderVersion changes whenever New builds the same pool's pods
// differently: pods of an earlier manager are then of an older template,
// replaced as the pool's idle pods are after a spec change, instead of
// looking current and failing Conforms.
const builderVersion = 3

// TemplateHash hashes what the pool's pods are built from, so pods built from
// an older spec (or by an earlier manager) can be found and replaced.
func TemplateHash(pool *sandboxv1alpha1.SandboxPool) string {
	s := pool.Spec
	b, _ := json.Marshal(struct {
		Builder           int
		Image, PullPolicy string
		Resources         corev1.ResourceRequirements
		Env               []corev1.EnvVar
		Template          *sandboxv1alpha1.SandboxPodTemplate
		RuntimeClass      *string
		Python            sandboxv1alpha1.PythonSpec
		Limits            sandboxv1alpha1.SandboxLimits
	}{builderVersion, s.Image, string(s.ImagePullPolicy), s.Resources, s.Env, s.Template, s.RuntimeClassName, s.Python, s.Limits})
	h := fnv.New32a()
	_, _ = h.Write(b)
	return fmt.Sprintf("%08x", h.Sum32())
}

// New builds an idle sandbox pod of the pool (without owner reference; the
// caller sets it) whose agent accepts tokens signed with key for it alone.
func New(pool *sandboxv1alpha1.SandboxPool, key AgentKey) *corev1.Pod {
	s := pool.Spec
	labels := map[string]string{}
	annotations := map[string]string{}
	var tmplSpec sandboxv1alpha1.SandboxPodSpec
	if s.Template != nil {
		for k, v := range s.Template.Metadata.Labels {
			labels[k] = v
		}
		for k, v := range s.Template.Metadata.Annotations {
			annotations[k] = v
		}
		tmplSpec = s.Template.Spec
	}
	// The sandbox's writable directories are filesystems of a fixed size inside
	// gVisor, so that filling one fails a write with ENOSPC instead of the
	// kubelet evicting the pod; set last, so a template cannot change them.
	for _, v := range scratchVolumes(pool) {
		for k, val := range gvisorMountHints(v) {
			annotations[k] = val
		}
	}
	labels[LabelPool] = pool.Name
	labels[LabelState] = StateIdle
	labels[LabelTemplateHash] = TemplateHash(pool)
	labels[LabelAgentKey] = key.ID

	resources := sandboxResources(s.Resources)

	args := []string{"serve",
		"--listen", fmt.Sprintf(":%d", AgentPort),
		"--trusted-keys", key.Trusted,
		"--workspace", WorkspaceDir,
		// Emptied with the workspace before a FreshInterpreter pod's next user.
		"--scratch-dirs", TmpDir,
	}
	if len(s.Python.Preload) > 0 {
		args = append(args, "--preload", strings.Join(s.Python.Preload, ","))
	}
	if d := s.ExecutionDefaults.Timeout; d != nil {
		args = append(args, "--default-timeout", d.Duration.String())
	}
	// The agent refuses longer runs too, whichever path sends them.
	args = append(args, "--max-timeout", MaxTimeout(pool).String())
	args = append(args, "--max-output-bytes", fmt.Sprint(sandboxv1alpha1.MaxOutputBytesLimit))
	memory, processes := CodeLimits(pool)
	args = append(args, "--memory-limit", fmt.Sprint(memory), "--max-processes", fmt.Sprint(processes))
	if c := canaryFor(pool); c != "" {
		args = append(args, "--egress-canary", c)
	}

	env := append([]corev1.EnvVar{
		{Name: "HOME", Value: WorkspaceDir},
		{Name: "TMPDIR", Value: TmpDir},
	}, s.Env...)
	// Last, so that no pool env of the same name replaces it (the API refuses
	// WARMPOOL_ names in spec.env too).
	env = append(env, corev1.EnvVar{Name: EnvPodUID, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.uid"}}})

	// Every probe is an HTTP request through gVisor's network stack into the
	// agent, the largest part of what an idle sandbox costs when made every
	// second. The startup probe is quick, so that a new pod is Ready within a
	// second of its agent (the kubelet runs the readiness probe at once when
	// the startup probe passes); once started, readiness and liveness are
	// rare and tolerant: a node starved of CPU, where a probe can take seconds,
	// does not make warm pods flap. A dead agent ends the container (the pod
	// fails at once, restartPolicy Never): the probes only catch a hung one.
	probe := func(path string, period, failures, timeout int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("agent"),
			}},
			PeriodSeconds: period, FailureThreshold: failures, TimeoutSeconds: timeout,
		}
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pool.Namespace,
			GenerateName: pool.Name + "-",
			Labels:       labels,
			Annotations:  annotations,
		},
		Spec: corev1.PodSpec{
			// A crashed agent means a lost interpreter: the pod fails and the pool replaces it.
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: &terminationGraceInPod,
			NodeSelector:                  tmplSpec.NodeSelector,
			Tolerations:                   tmplSpec.Tolerations,
			Affinity:                      tmplSpec.Affinity,
			TopologySpreadConstraints:     spread(pool, tmplSpec.TopologySpreadConstraints),
			PriorityClassName:             tmplSpec.PriorityClassName,
			ImagePullSecrets:              tmplSpec.ImagePullSecrets,
			SchedulerName:                 tmplSpec.SchedulerName,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](RunAsUser),
				RunAsGroup:     ptr.To[int64](RunAsUser),
				FSGroup:        ptr.To[int64](RunAsUser),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           s.Image,
				ImagePullPolicy: s.ImagePullPolicy,
				Args:            args,
				Env:             env,
				Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: AgentPort, Protocol: corev1.ProtocolTCP}},
				Resources:       resources,
				// The agent writes why it gave up to /dev/termination-log; its log's
				// tail stands in if it could not.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				// Up to StartupProbeSeconds to start (a preload of large
				// modules under gVisor takes a while), then ended and replaced.
				StartupProbe:   probe("/v1/readyz", 1, StartupProbeSeconds, 2),
				ReadinessProbe: probe("/v1/readyz", 10, 3, 5),
				LivenessProbe:  probe("/v1/healthz", 30, 3, 5),
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					RunAsNonRoot:             ptr.To(true),
					Privileged:               ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
	for _, v := range scratchVolumes(pool) {
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: v.name, MountPath: v.path})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: v.name,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(v.evictAt())}}})
	}
	if rc := s.RuntimeClassName; rc != nil && *rc != "" {
		pod.Spec.RuntimeClassName = ptr.To(*rc)
	}
	return pod
}

// DefaultMaxTimeout is spec.executionDefaults.maxTimeout of pools written
// before it existed (the CRD defaults it for new ones).
const DefaultMaxTimeout = time.Hour

// MaxTimeout is the longest timeout a run of the pool may ask for.
func MaxTimeout(pool *sandboxv1alpha1.SandboxPool) time.Duration {
	if m := pool.Spec.ExecutionDefaults.MaxTimeout; m != nil {
		return m.Duration
	}
	return DefaultMaxTimeout
}

// IsReady reports whether the pod's Ready condition is true.
func IsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// IsTerminal reports whether the pod has ended or is being deleted.
func IsTerminal(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
}

// IsIdle reports whether the pod may be claimed: ready, unclaimed, not ending.
func IsIdle(pod *corev1.Pod) bool {
	return pod.Labels[LabelState] == StateIdle && !IsTerminal(pod) && IsReady(pod)
}

// Defaults of spec.limits, for pools written before it existed (the CRD
// defaults the field for new ones).
var (
	DefaultMemoryReserve = resource.MustParse("96Mi")
	DefaultProcesses     = int32(128)
	// minCodeMemory is what the code gets at least, whatever the reserve.
	minCodeMemory = int64(32 << 20)
)

// CodeLimits returns the memory (bytes) and the processes the code in the
// pool's sandboxes may use: the container's memory limit less the reserve,
// and spec.limits.processes (0: unlimited).
func CodeLimits(pool *sandboxv1alpha1.SandboxPool) (memory int64, processes int32) {
	l := pool.Spec.Limits
	reserve, processes := DefaultMemoryReserve, DefaultProcesses
	if l.MemoryReserve != nil {
		reserve = *l.MemoryReserve
	}
	if l.Processes != nil {
		processes = *l.Processes
	}
	limit := sandboxResources(pool.Spec.Resources).Limits[corev1.ResourceMemory]
	memory = max(limit.Value()-reserve.Value(), minCodeMemory)
	return memory, processes
}

// sandboxResources always sets limits, and requests below them. The CRD
// defaults cover a pool without `resources`, but Go clients send an empty
// `resources: {}`, which the API server does not default; left alone, the
// kubelet would request the whole limit for every warm (mostly idle) pod.
func sandboxResources(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := *r.DeepCopy()
	if out.Limits == nil {
		out.Limits = corev1.ResourceList{}
	}
	if out.Requests == nil {
		out.Requests = corev1.ResourceList{}
	}
	for name, d := range map[corev1.ResourceName]struct{ limit, request resource.Quantity }{
		corev1.ResourceCPU:    {DefaultCPULimit, DefaultCPURequest},
		corev1.ResourceMemory: {DefaultMemoryLimit, DefaultMemoryRequest},
	} {
		limit, ok := out.Limits[name]
		if !ok {
			limit = d.limit
			if req, ok := out.Requests[name]; ok && req.Cmp(limit) > 0 {
				limit = req
			}
			out.Limits[name] = limit
		}
		if _, ok := out.Requests[name]; !ok {
			req := d.request
			if req.Cmp(limit) > 0 {
				req = limit
			}
			out.Requests[name] = req
		}
	}
	return out
}

// spread is the topology spread of a pool's new pods: the template's
// constraints as they are, else one over nodes per spec.nodeSpread. Not in
// TemplateHash: it places new pods and moves none, so changing it (or an
// upgrade that defaults it) rolls no pod.
func spread(pool *sandboxv1alpha1.SandboxPool, own []corev1.TopologySpreadConstraint) []corev1.TopologySpreadConstraint {
	if len(own) > 0 {
		return own
	}
	when := corev1.ScheduleAnyway
	switch pool.Spec.NodeSpread {
	case sandboxv1alpha1.NodeSpreadNone:
		return nil
	case sandboxv1alpha1.NodeSpreadRequired:
		when = corev1.DoNotSchedule
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       corev1.LabelHostname,
		WhenUnsatisfiable: when,
		// The pool's pods, busy or idle: a node that holds a pool's busy
		// Sessions is as much at risk as one that holds its idle pods.
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelPool: pool.Name}},
		// Nodes the pod could not run on (taints it does not tolerate, the
		// pool's node selector) do not count toward the skew.
		NodeAffinityPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
		NodeTaintsPolicy:   ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
}
