package v1alpha1

// Condition types and reasons. Reasons are CamelCase and say what a user can act on.
const (
	// SandboxPool conditions.

	// PoolConditionReady is True when the pool has spec.replicas idle Ready pods.
	PoolConditionReady = "Ready"
	// PoolConditionDegraded is True when pods of the pool cannot start or keep failing.
	PoolConditionDegraded = "Degraded"
	// PoolConditionNetworkPolicyReady is True when the pool's NetworkPolicy
	// exists as the operator wrote it. Whether the cluster enforces it depends
	// on its network plugin.
	PoolConditionNetworkPolicyReady = "NetworkPolicyReady"
	// PoolConditionScalingLimited is True while the pool wants more pods than
	// it may have: autoscaling.maxReplicas, spec.maxPods or the namespace's
	// ResourceQuota holds it back (the HorizontalPodAutoscaler's condition).
	PoolConditionScalingLimited = "ScalingLimited"
	// PoolConditionSessionSuspend, on a pool that sets sessionSuspendAfter, is
	// True when idle Sessions are suspended, False (NoSnapshotStore) when the
	// manager has no snapshot store to suspend them to.
	PoolConditionSessionSuspend = "SessionSuspend"

	// PoolConditionShared, on a pool that sets spec.sharing, is True when
	// the manager lets other namespaces use it, False (SharingNotAllowed)
	// when the pool's namespace is not one it shares pools from.
	PoolConditionShared = "Shared"

	// PoolConditionProgressing says how far the pool is in replacing its
	// warm pods after a change of its template (image, preload, env...):
	// True with RollingOut while older pods remain, True with
	// RolloutComplete once every warm pod is current, False with
	// RolloutStalled while the new pods fail to start and the older ones
	// keep serving.
	PoolConditionProgressing = "Progressing"

	// Execution conditions.

	// ExecutionConditionWaitingForSandbox is True while no pod of the pool is free.
	ExecutionConditionWaitingForSandbox = "WaitingForSandbox"
	// ExecutionConditionComplete is True once the Execution finished; its reason
	// says how (Succeeded, Error, TimedOut, Cancelled, SandboxLost, ...).
	ExecutionConditionComplete = "Complete"

	// Session conditions.

	// SessionConditionReady is True while the Session holds a pod whose
	// interpreter keeps its state; its reason says why not otherwise.
	SessionConditionReady = "Ready"
	// SessionConditionMovable is False while the Session's node is being
	// drained and the Session cannot move off it (ReasonTooLargeToMove,
	// ReasonNoSnapshotStore): the drain waits for it, as for a busy pod.
	// Removed once it moved, or the node is no longer drained.
	SessionConditionMovable = "Movable"
)

// Condition reasons.
const (
	ReasonPoolNotFound   = "PoolNotFound"
	ReasonNoIdleSandbox  = "NoIdleSandbox"
	ReasonMaxPodsReached = "MaxPodsReached"
	ReasonSandboxClaimed = "SandboxClaimed"
	ReasonSucceeded      = "Succeeded"
	ReasonError          = "Error"
	ReasonTimedOut       = "TimedOut"
	ReasonCancelled      = "Cancelled"
	ReasonSandboxLost    = "SandboxLost"
	ReasonSessionLost    = "SessionLost"
	// ReasonSandboxRefused: a pod that named the Execution (its claim, or the
	// name of its pod) is not one the manager may give its code: not its
	// pool's, not built as the pool builds its pods, an agent of another
	// protocol, or another pod than the one the Execution recorded. Nothing
	// was sent to it.
	ReasonSandboxRefused = "SandboxRefused"
	// ReasonRequeued (an Event): the node of the Execution's claimed pod
	// stopped answering before its code was sent there; the pod is deleted
	// and the Execution waits for another.
	ReasonRequeued = "Requeued"
	// ReasonTimeoutAboveLimit: the Execution asks for a longer timeout than
	// its pool's executionDefaults.maxTimeout.
	ReasonTimeoutAboveLimit = "TimeoutAboveLimit"
	// ReasonSessionBusy: an earlier Execution of the session runs or waits.
	ReasonSessionBusy = "SessionBusy"
	// ReasonSessionPending: the Execution's Session waits for a pod.
	ReasonSessionPending = "SessionPending"
	// ReasonSessionPoolMismatch: the Execution names a Session of another pool.
	ReasonSessionPoolMismatch = "SessionPoolMismatch"
	// ReasonSessionOwnerOnly: the Execution names a Session bound to its
	// owner (spec.access Owner), and its spec.owner is not that user.
	ReasonSessionOwnerOnly = "SessionOwnerOnly"
	// Session reasons. ReasonIdleTimeout, ReasonMaxLifetime and ReasonClosed
	// end a Session (Closed); ReasonSandboxLost, ReasonNodeLost,
	// ReasonInterpreterRestarted and ReasonContextFailed lose it (Lost).
	ReasonIdleTimeout          = "IdleTimeout"
	ReasonMaxLifetime          = "MaxLifetimeReached"
	ReasonClosed               = "Closed"
	ReasonInterpreterRestarted = "InterpreterRestarted"
	ReasonContextFailed        = "ContextFailed"
	// ReasonNeverRestored ends (Closed) a Session that waited for its state
	// from a snapshot (AnnotationRestoring: a fork, a caller's restore) and
	// was not given it within a few minutes of being Ready: the data plane
	// that forked it stopped part-way, or the caller went away.
	ReasonNeverRestored = "NeverRestored"
	// ReasonNodeLost loses a Session (Lost) whose pod's node stopped
	// answering (its Ready condition Unknown): its state was in that pod's
	// memory. The message names the node.
	ReasonNodeLost = "NodeLost"
	// ReasonSuspended: the Session was idle past its suspendAfter; its state
	// is in the snapshot store and its next run resumes it. ReasonResumed: it
	// holds a pod again, with its state. ReasonSnapshotLost: its snapshot
	// could not be read back (gone from the store, or not decryptable with
	// the manager's key): the Session is Lost.
	ReasonSuspended    = "Suspended"
	ReasonResumed      = "Resumed"
	ReasonResuming     = "Resuming"
	ReasonSnapshotLost = "SnapshotLost"
	// ReasonMoving: the Session's node is being drained (cordoned, or tainted
	// by a tool that removes nodes); its state is saved, and it resumes on a
	// pod of another node at once (Suspended for that moment). ReasonMoved:
	// it holds that pod, with its state (status.lastMove says from where).
	// ReasonTooLargeToMove: its state is over the snapshot limit, so it
	// stays, and the drain waits for it.
	ReasonMoving         = "Moving"
	ReasonMoved          = "Moved"
	ReasonTooLargeToMove = "TooLargeToMove"
	// ReasonRecovering: a durable Session's pod or node was lost; it
	// resumes from its last checkpoint on another pod (Suspended for that
	// moment). ReasonRecovered: it holds that pod, with the checkpoint's
	// state (status.lastMove.checkpoint says which run it is from).
	ReasonRecovering = "Recovering"
	ReasonRecovered  = "Recovered"
	// ReasonCheckpointFailed (an Event): a durable Session's checkpoint could
	// not be saved; the last one stays, and the next is tried soon.
	ReasonCheckpointFailed = "CheckpointFailed"
	// ReasonSuspendFailed (an Event): the snapshot could not be taken or
	// stored; the Session keeps its pod and is tried again later.
	ReasonSuspendFailed = "SuspendFailed"
	// Pool reasons of PoolConditionSessionSuspend.
	ReasonSnapshotStoreConfigured = "SnapshotStoreConfigured"
	ReasonNoSnapshotStore         = "NoSnapshotStore"
	// ReasonSuspendAfterIdleTimeout: sessionSuspendAfter is not shorter than
	// the idle timeout, so no Session lives long enough to be suspended.
	ReasonSuspendAfterIdleTimeout = "SuspendAfterIdleTimeout"
	// Shared pools. ReasonSharing, ReasonSharingNotAllowed: the pool's
	// Shared condition. ReasonPoolNotShared: the Execution or Session names
	// a pool of another namespace that is not shared (no spec.sharing, or
	// the manager does not share pools from there). ReasonNamespaceNotAdmitted:
	// the shared pool's namespaceSelector does not pick its namespace.
	// ReasonTenantLimitReached: its namespace holds sharing's maxPods or
	// maxSessions of the pool; it waits. ReasonTenantQueueFull: maxWaiting
	// of its namespace's Executions wait already; it failed.
	ReasonSharing              = "Sharing"
	ReasonSharingNotAllowed    = "SharingNotAllowed"
	ReasonPoolNotShared        = "PoolNotShared"
	ReasonNamespaceNotAdmitted = "NamespaceNotAdmitted"
	ReasonTenantLimitReached   = "TenantLimitReached"
	ReasonTenantQueueFull      = "TenantQueueFull"
	// ReasonCodeSourceChanged: after a manager restart the run had not reached
	// the sandbox, and spec.codeFrom now holds other code than what started.
	ReasonCodeSourceChanged  = "CodeSourceChanged"
	ReasonCodeSourceNotFound = "CodeSourceNotFound"
	ReasonImagePullBackOff   = "ImagePullBackOff"
	ReasonCrashLoopBackOff   = "CrashLoopBackOff"
	// ReasonSandboxStartFailed: pods fail before they can run code (a preload
	// that does not import, an image without python); replacements back off.
	ReasonSandboxStartFailed = "SandboxStartFailed"
	ReasonPodsStarting       = "PodsStarting"
	// Rollout reasons of PoolConditionProgressing.
	ReasonRollingOut      = "RollingOut"
	ReasonRolloutComplete = "RolloutComplete"
	ReasonRolloutStalled  = "RolloutStalled"
	// ReasonUnsupportedAgent: a pod's agent speaks a protocol version this
	// manager does not; it is replaced, never called.
	ReasonUnsupportedAgent = "UnsupportedAgent"
	// ReasonPodsDisplaced (an Event): unclaimed pods on a node the pool may no
	// longer use (cordoned, draining, tainted, not Ready, out of its node
	// selector) are replaced by pods elsewhere.
	ReasonPodsDisplaced = "PodsDisplaced"
	// ReasonUnschedulable: the scheduler finds no node for the pool's pods
	// (its message says why: CPU, memory, selectors, taints).
	ReasonUnschedulable     = "Unschedulable"
	ReasonIdleReplicasReady = "IdleReplicasReady"
	ReasonPodsHealthy       = "PodsHealthy"
	// ScalingLimited reasons: ReasonResourceQuota (the API server refused a
	// pod for the namespace's quota), ReasonMaxPods, ReasonMaxReplicas; else
	// ReasonWithinLimits.
	ReasonResourceQuota = "ResourceQuota"
	ReasonMaxPods       = "MaxPods"
	ReasonMaxReplicas   = "MaxReplicas"
	ReasonWithinLimits  = "WithinLimits"
	ReasonPolicyApplied = "PolicyApplied"
	ReasonPolicyFailed  = "PolicyFailed"
	// ReasonOtherPoliciesApply: the pool's policy is in place, but other
	// NetworkPolicies select its pods and allow them traffic (they add up).
	ReasonOtherPoliciesApply  = "OtherPoliciesApply"
	ReasonCodeSourceNotMarked = "CodeSourceNotMarked"
	// ReasonMemoryLimitExceeded: the code raised MemoryError at the sandbox's
	// memory budget, or its processes passed it together and were killed.
	ReasonMemoryLimitExceeded = "MemoryLimitExceeded"
	// ReasonProcessLimitReached: the code could not start a process or thread
	// at the sandbox's spec.limits.processes.
	ReasonProcessLimitReached = "ProcessLimitReached"
	// ReasonDiskLimitReached: a write of the code failed with ENOSPC: /workspace
	// or /tmp was full (spec.limits.workspaceSize, spec.limits.tmpSize).
	ReasonDiskLimitReached = "DiskLimitReached"
	// ReasonOOMKilled: the kernel killed the sandbox container at its memory limit.
	ReasonOOMKilled = "OOMKilled"
	// ReasonEvicted: the kubelet evicted the sandbox pod (disk, memory pressure).
	ReasonEvicted = "Evicted"
)
