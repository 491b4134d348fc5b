// Package metrics holds warmpool's Prometheus metrics, registered with
// controller-runtime's registry (served on the manager's /metrics). Labels are
// bounded: phases and reasons are fixed sets; pools are named per namespace,
// like kube-state-metrics does for workloads.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/warmpool/warmpool/internal/version"
)

var (
	// BuildInfo is 1, labelled with the running build, the way Prometheus
	// and most exporters say which version a target runs (join on it, or
	// alert on its absence: every manager replica exports it, leader or not).
	BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_build_info",
		Help: "A metric with a constant '1' value labelled by the version, revision and Go version of the running manager.",
	}, []string{"version", "revision", "goversion"})

	// ExecutionsTotal counts finished Executions by phase and the reason of
	// their Complete condition (a fixed set: Succeeded, Error, TimedOut,
	// SandboxLost, OOMKilled, MemoryLimitExceeded, ...).
	ExecutionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_executions_total",
		Help: "Finished Executions by final phase and reason.",
	}, []string{"phase", "reason"})
	// ExecutionInterrupts counts running code that was interrupted (SIGINT,
	// KeyboardInterrupt) and why: its timeout, or a cancel.
	ExecutionInterrupts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_execution_interrupts_total",
		Help: "Executions whose running code was interrupted, by cause (timeout, cancel).",
	}, []string{"cause"})
	// ExecutionKills counts runs that ended with the interpreter killed and
	// the pod deleted, by cause: interrupt_ignored (the code outlived SIGINT
	// by the grace period), memory (the memory limit or the OOM killer),
	// unresponsive (the agent did not answer by the deadline and grace).
	ExecutionKills = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_execution_kills_total",
		Help: "Executions whose interpreter was killed, by cause (interrupt_ignored, memory, unresponsive).",
	}, []string{"cause"})
	// AgentErrors counts the manager's calls to sandbox agents that failed
	// (no answer, refused, a broken stream) by operation.
	AgentErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_agent_request_errors_total",
		Help: "Failed calls of the manager to sandbox agents by operation (execute, attach, interrupt, reset, health).",
	}, []string{"operation"})
	// SessionsEnded counts Sessions that reached a final phase, by phase and reason.
	SessionsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_sessions_ended_total",
		Help: "Sessions that ended, by final phase (Closed, Lost, ...) and reason (IdleTimeout, MaxLifetimeReached, SandboxLost, ...).",
	}, []string{"phase", "reason"})

	// DataPlaneRequests counts data-plane requests by subresource and HTTP code.
	DataPlaneRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_dataplane_requests_total",
		Help: "Requests to the Sessions data plane by subresource (exec, interrupt, files, ...) and HTTP status code.",
	}, []string{"subresource", "code"})
	// DataPlaneDuration is how long data-plane requests took (an exec: until its result).
	DataPlaneDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warmpool_dataplane_request_duration_seconds", Help: "Duration of Sessions data-plane requests by subresource.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"subresource"})
	// SessionLease is how long the Session controller's lease took.
	SessionLease = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_session_lease_seconds",
		Help:    "Time the Session controller took to lease a pod to a Session: from the reconcile that found one to the Ready status stored.",
		Buckets: []float64{0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10},
	})
	// SessionReady is how long a new Session waited for its pod, as the
	// manager saw it (the comparable of a claim's latency on other systems).
	SessionReady = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_session_ready_seconds",
		Help:    "Time from the manager's first sight of a new Session (its watch event) to its first Ready status stored: the queue, the lease and the agent's answer.",
		Buckets: []float64{0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	})
	// SessionSuspend and SessionResume time the two halves of a suspend:
	// from the reconcile that decided it to the status stored.
	SessionSuspend = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warmpool_session_suspend_seconds",
		Help:    "Time to suspend a Session (snapshot, store, Suspended status), by result (suspended, failed).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"result"})
	SessionResume = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_session_resume_seconds",
		Help:    "Time to resume a Session on a warm pod: from the reconcile that found the pod to the Ready status stored (claim, read and restore of the snapshot).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	})
	// SessionCheckpoint times a durable Session's checkpoints (snapshot and
	// upload, after its run), by result; SessionCheckpointBytes sizes them.
	SessionCheckpoint = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warmpool_session_checkpoint_seconds",
		Help:    "Time to checkpoint a durable Session (snapshot and store, off its runs' path), by result (stored, failed).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"result"})
	SessionCheckpointBytes = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_session_checkpoint_bytes",
		Help:    "Size of durable Sessions' checkpoints, before encryption.",
		Buckets: prometheus.ExponentialBuckets(1024, 4, 10),
	})
	// SessionMovePause is how long a Session moving off a drained node could
	// not run: from its seal to Ready on a pod of another node.
	SessionMovePause = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_session_move_pause_seconds",
		Help:    "Time a Session moving off a drained node paused: from the start of its snapshot to Ready on a pod of another node.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	})
	// DataPlaneResume is how long requests to a Suspended Session waited for its resume.
	// MemoryBudget is the bytes of this process's memory budget for work
	// that holds a Session's state (internal/membudget): forks, suspends,
	// resumes. MemoryBudgetInUse is what such work holds now, and
	// MemoryBudgetRefused counts the work it refused (by operation, and
	// whether the namespace held its share or the process its limit).
	MemoryBudget = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "warmpool_memory_budget_bytes",
		Help: "This process's memory budget for forks, suspends and resumes (from its container's memory limit; 0: none).",
	})
	MemoryBudgetInUse = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "warmpool_memory_budget_in_use_bytes",
		Help: "Bytes of the memory budget forks, suspends and resumes hold now.",
	})
	MemoryBudgetRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_memory_budget_refused_total",
		Help: "Forks, suspends and resumes the memory budget refused (429 or a later look), by operation and by what was full: namespace (its share) or process.",
	}, []string{"operation", "full"})
	// DataPlaneQueueWait is how long data-plane requests waited for one of
	// their namespace's seats; DataPlaneQueueRefused counts those refused
	// (429) because the namespace's queue was full or they waited too long.
	DataPlaneQueueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_dataplane_queue_wait_seconds",
		Help:    "Time data-plane requests waited for one of their namespace's seats in the replica (those that waited).",
		Buckets: waitBuckets,
	})
	DataPlaneQueueRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_dataplane_queue_refused_total",
		Help: "Data-plane requests refused 429 by their namespace's fairness limit: queue_full, waited (longer than the queue's wait), or spent (the namespace's rate: its turn further off than the queue's wait).",
	}, []string{"reason"})
	// DataPlaneSpendWait is how long data-plane requests waited for their
	// namespace's rate to pay for them (those that waited).
	DataPlaneSpendWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_dataplane_spend_wait_seconds",
		Help:    "Time data-plane requests waited for their namespace's rate in the replica to pay for them (those that waited).",
		Buckets: waitBuckets,
	})
	DataPlaneResume = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_dataplane_resume_seconds",
		Help:    "Time a data-plane request to a Suspended Session waited for the Session to be resumed (asked, leased, restored, Ready).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	})
	// DataPlaneRunLease is how long one-call runs waited for their new
	// Session to be Ready (the Session's create call included).
	DataPlaneRunLease = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "warmpool_dataplane_run_lease_seconds",
		Help:    "Time from a one-call run's Session create to that Session Ready, as the data plane saw it.",
		Buckets: []float64{0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
	})

	latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

	// QueueWait is the time from an Execution's creation until it claimed a pod.
	QueueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "warmpool_execution_queue_wait_seconds", Help: "Time from creation until a sandbox pod was claimed.",
		Buckets: latencyBuckets,
	})
	// RunDuration is how long code ran in the sandbox.
	RunDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "warmpool_execution_run_duration_seconds", Help: "Time the code ran in the sandbox.",
		Buckets: latencyBuckets,
	})
	// EndToEnd is the time from creation until the final status was written.
	EndToEnd = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "warmpool_execution_end_to_end_seconds", Help: "Time from an Execution's creation until its final status.",
		Buckets: latencyBuckets,
	})
	// PodStart is the time from a sandbox pod's creation until it was Ready.
	PodStart = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "warmpool_pod_start_seconds", Help: "Time from a sandbox pod's creation until Ready.",
		Buckets: []float64{0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120},
	})
	// PoolPods counts a pool's pods by state (idle, busy, warming).
	PoolPods = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_pods", Help: "Pods of a SandboxPool by state.",
	}, []string{"namespace", "pool", "state"})
	// PoolSessions counts a pool's pods held by Sessions (part of the busy pods).
	PoolSessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_sessions", Help: "Pods of a SandboxPool held by Sessions (Sessions and Executions with spec.session).",
	}, []string{"namespace", "pool"})
	// PoolCondition mirrors a pool's status conditions (1 True, 0 otherwise),
	// for alerts on Degraded and ScalingLimited with the status's own judgement.
	PoolCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_status_condition", Help: "Conditions of a SandboxPool's status by type: 1 when True, 0 otherwise.",
	}, []string{"namespace", "pool", "type"})
	// PoolOldestWarming and PoolOldestPending are timestamps, not ages, so
	// that they stay right between reconciles: time() - x is the age; the
	// series is absent while there is nothing of the kind.
	PoolOldestWarming = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_oldest_warming_pod_created_timestamp_seconds",
		Help: "Creation time (Unix seconds) of a SandboxPool's oldest pod that is not Ready yet; absent when none starts.",
	}, []string{"namespace", "pool"})
	PoolOldestPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_oldest_pending_created_timestamp_seconds",
		Help: "Creation time (Unix seconds) of a SandboxPool's oldest Execution or Session waiting for a pod; absent when none waits.",
	}, []string{"namespace", "pool"})
	// PoolTenant counts, on a shared pool, what each tenant namespace holds
	// and waits for. The tenant label is bounded by the namespaces the
	// pool's selector admits (at most 100 per pool are reported, as in status).
	PoolTenant = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_tenant_pods",
		Help: "Of a shared SandboxPool, the pods a tenant namespace holds (state=\"held\"), its Sessions holding a pod (state=\"sessions\") and its Executions and Sessions waiting (state=\"waiting\").",
	}, []string{"namespace", "pool", "tenant", "state"})
	// PoolTenantQueueWait is what fair sharing decides: how long a claim
	// waited in the manager's queue, from when the manager saw it until a
	// pod was chosen for it, by the namespace it came from (tenant is
	// bounded by the namespaces a pool admits: its own, for a pool that is
	// not shared). Time before the manager saw the claim (the API server,
	// the watch) and the claim's own write are not in it; the end-to-end
	// wait is warmpool_execution_queue_wait_seconds.
	PoolTenantQueueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warmpool_pool_tenant_queue_wait_seconds",
		Help:    "Time a claim of a SandboxPool's pod (an Execution outside a session, a Session) waited in the manager's queue until a pod was chosen, by the namespace it came from.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"namespace", "pool", "tenant"})
	// PoolPending counts a pool's Executions waiting for a pod.
	PoolPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_pending_executions", Help: "Executions waiting for a pod of a SandboxPool.",
	}, []string{"namespace", "pool"})
	// PoolClaims counts the claims of a pool's pods (Executions outside
	// sessions, Sessions) by how they were served: the warm-hit ratio is
	// rate(outcome="warm") / rate(all), what HPA or KEDA rules can target.
	PoolClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_pool_claims_total",
		Help: "Claims of a SandboxPool's pods by outcome: warm (the pod was Ready before the claim) or cold (it waited for a pod to start).",
	}, []string{"namespace", "pool", "outcome"})
	// LLMCalls counts Executions' model calls answered through a
	// ModelEndpoint; endpoint is bounded by the ModelEndpoints a platform team makes.
	LLMCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_llm_calls_total",
		Help: "llm_query/rlm_query calls of Executions answered by a ModelEndpoint, by endpoint and outcome (ok, error, refused).",
	}, []string{"endpoint", "outcome"})
	// LLMTokens counts the tokens endpoints reported.
	LLMTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warmpool_llm_tokens_total",
		Help: "Tokens ModelEndpoints reported for Executions' calls, by endpoint and kind (prompt, completion).",
	}, []string{"endpoint", "kind"})
	// LLMCallDuration is how long model calls took.
	LLMCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warmpool_llm_call_duration_seconds", Help: "Duration of calls to ModelEndpoints.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"endpoint"})
	// PoolWarmHitRatio is the share of a pool's claims of the last minute
	// that found a warm pod (status.autoscaling.warmHitRatio for autoscaled
	// pools), for dashboards and alerts; over other windows,
	// rate(warmpool_pool_claims_total{outcome="warm"}) over all outcomes.
	PoolWarmHitRatio = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_warm_hit_ratio",
		Help: "Share of a SandboxPool's claims of the last minute served by a pod that was Ready before the claim (absent without claims).",
	}, []string{"namespace", "pool"})
	// PoolDesiredReplicas is the idle pods an autoscaled pool's autoscaler asks for.
	PoolDesiredReplicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warmpool_pool_autoscaler_desired_replicas", Help: "Idle pods the autoscaler of a SandboxPool asks for.",
	}, []string{"namespace", "pool"})
)

func init() {
	metrics.Registry.MustRegister(BuildInfo, ExecutionsTotal, ExecutionInterrupts, ExecutionKills, AgentErrors, SessionsEnded,
		QueueWait, RunDuration, EndToEnd, PodStart, PoolPods, PoolSessions, PoolCondition, PoolOldestWarming, PoolOldestPending,
		PoolPending, PoolTenant, PoolTenantQueueWait, DataPlaneRequests, DataPlaneDuration, DataPlaneRunLease, SessionLease, SessionReady, SessionSuspend, SessionResume, SessionMovePause, SessionCheckpoint, SessionCheckpointBytes, DataPlaneResume, PoolClaims, PoolWarmHitRatio, PoolDesiredReplicas,
		LLMCalls, LLMTokens, LLMCallDuration, MemoryBudget, MemoryBudgetInUse, MemoryBudgetRefused,
		DataPlaneQueueWait, DataPlaneQueueRefused, DataPlaneSpendWait)
	v := version.Get()
	BuildInfo.WithLabelValues(v.Version, v.Commit, v.GoVersion).Set(1)
	// Counters start at zero for the label values every cluster sees, so
	// that rate() and increase() count the first event after a restart too
	// (a series born at 1 has no earlier sample to count from).
	for phase, reason := range map[string]string{"Succeeded": "Succeeded", "Failed": "Error", "TimedOut": "TimedOut", "Cancelled": "Cancelled"} {
		ExecutionsTotal.WithLabelValues(phase, reason)
	}
	for _, cause := range []string{"timeout", "cancel"} {
		ExecutionInterrupts.WithLabelValues(cause)
	}
	for _, cause := range []string{"interrupt_ignored", "memory", "unresponsive"} {
		ExecutionKills.WithLabelValues(cause)
	}
	for _, op := range []string{"execute", "attach", "interrupt", "reset", "health"} {
		AgentErrors.WithLabelValues(op)
	}
}

// ForgetPool removes a deleted pool's series.
func ForgetPool(namespace, pool string) {
	for _, s := range []string{"idle", "busy", "warming"} {
		PoolPods.DeleteLabelValues(namespace, pool, s)
	}
	PoolPending.DeleteLabelValues(namespace, pool)
	PoolSessions.DeleteLabelValues(namespace, pool)
	PoolCondition.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
	PoolOldestWarming.DeleteLabelValues(namespace, pool)
	PoolOldestPending.DeleteLabelValues(namespace, pool)
	for _, o := range []string{"warm", "cold"} {
		PoolClaims.DeleteLabelValues(namespace, pool, o)
	}
	PoolDesiredReplicas.DeleteLabelValues(namespace, pool)
	PoolWarmHitRatio.DeleteLabelValues(namespace, pool)
	PoolTenant.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
	PoolTenantQueueWait.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
}

// waitBuckets are the data plane's buckets for a request's wait for its
// namespace's seat or turn: a millisecond up to the queue's 30 s.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}
