package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/pool"
	"github.com/warmpool/warmpool/internal/controller/wakeup"
	"github.com/warmpool/warmpool/internal/dispatch"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/membudget"
	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
)

// Runtime is the machinery the manager's parts share, built once by
// newRuntime: the one place where the dispatcher, the gate, the runner and
// the wake-ups between them are wired, each at its construction.
// Reconcilers get what they need of it when Setup builds them; none creates
// or rewires any of it.
//
// What runs where (Config.Mode; in a cluster, two Deployments of one binary):
//   - the data plane (ModeDataPlane), in every replica, with no leader
//     election: the agent keys (agentkeys loads them), the data plane and its
//     serving certificate. Its calls to agents go through Gate, signed with
//     Keys. It has no lease to lose, so a leader that changes, restarts or is
//     starved of CPU does not stop runs in Ready Sessions;
//   - the controllers (ModeControllers), under leader election: the agent
//     keys in every replica; on the leader only, the pool, Execution,
//     Session and ModelEndpoint reconcilers, and with them the Dispatcher's
//     queues and the runs of Executions.
//
// ModeAll runs both in one process.
type Runtime struct {
	// Keys sign every call to an agent (internal/agentauth).
	Keys *agentauth.Keyring
	// Dispatcher hands free pods to waiting Executions and Sessions, one
	// queue per pool, fed by the reconcilers' watch events.
	Dispatcher *dispatch.Dispatcher
	// Gate is the one door to the pods' agents: every client of an agent
	// the manager uses is opened there (agentgate).
	Gate *agentgate.Gate
	// Runner runs Executions on the agents the gate opened for them.
	Runner *runner.Runner
	// Clock decides the reconcilers' time policies (Config.Clock).
	Clock clock.PassiveClock
	// Autoscalers keep each pool's demand record: the dispatcher records
	// every claim in it, the pool reconciler decides replicas from it.
	Autoscalers *pool.Autoscalers
	// Tenancy says which namespaces may use which pools (shared pools).
	Tenancy *tenancy.Gate
	// Memory bounds the bytes forks, suspends and resumes hold in this
	// process at once, the data plane's and the controllers' together.
	Memory *membudget.Budget
	// Nodes says which nodes a pool may no longer hand out pods on (the
	// controllers feed it from the node informer: setupControllers).
	Nodes *nodes.Tracker

	// The wake-ups the dispatcher and the runner deliver to each
	// reconciler's queue.
	executionWakes, sessionWakes, poolWakes *wakeup.Source
}

// newRuntime builds the runtime, every part given what it calls when it is
// built (nothing is wired in afterwards); c reads the pools of the pods the
// gate asks the version of, and the namespaces' labels shared pools admit
// by (the manager's cache).
func newRuntime(cfg Config, c client.Client) *Runtime {
	rt := &Runtime{Keys: &agentauth.Keyring{}, Clock: cfg.Clock, Memory: memoryBudget(cfg.MemoryBudget), Nodes: nodes.New(),
		executionWakes: &wakeup.Source{Priority: wakeup.High}, sessionWakes: &wakeup.Source{Priority: wakeup.High},
		// A burst of Executions becomes one pool reconcile.
		poolWakes: &wakeup.Source{Delay: pool.DemandDebounce}}
	if rt.Clock == nil {
		rt.Clock = clock.RealClock{}
	}
	shared := cfg.SharedPoolNamespaces
	if shared == nil {
		shared = tenancy.DefaultSharedNamespaces
	}
	rt.Tenancy = &tenancy.Gate{Namespaces: shared, Labels: tenancy.FromClient(c)}
	rt.Runner = runner.New(rt.executionWakes.Wake)
	rt.Autoscalers = pool.NewAutoscalers(rt.Clock.Now, cfg.AutoscaleWindow)
	// The gate tells the dispatcher of each pod whose agent said its
	// protocol, and the dispatcher asks the gate which pods are usable: the
	// one is built first, calling the other once that exists.
	var d *dispatch.Dispatcher
	rt.Gate = agentgate.New(rt.Keys, cfg.Resolver, c, func(p *corev1.Pod) {
		d.Recheck(p)
		rt.poolWakes.Wake(types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[sandboxpod.LabelPool]})
	})
	agents := rt.Gate.Agents() // which agent build and protocol each pod runs
	d = dispatch.New(dispatch.Options{
		WakeExecution: rt.executionWakes.Wake,
		WakeSession:   rt.sessionWakes.Wake,
		WakePool:      rt.poolWakes.Wake,
		OnClaim:       rt.Autoscalers.Claim,
		OnClaimed:     rt.Autoscalers.Claimed,
		// Until the keys are loaded (just after a start) a pod's key is not
		// judged: judged then, all would be unusable until their next change. A
		// pod whose key really is gone is replaced by its pool.
		Usable: func(pool *sandboxv1alpha1.SandboxPool, p *corev1.Pod) bool {
			return lease.MayServe(pool, p, rt.Keys) == nil && agents.Usable(p)
		},
		Placeable: func(pool *sandboxv1alpha1.SandboxPool, p *corev1.Pod) bool {
			return pool == nil || rt.Nodes.Excludes(pool, p.Spec.NodeName) == ""
		},
		PodGone:  func(p *corev1.Pod) { agents.Forget(p.UID) },
		Admitted: rt.Tenancy.Admitted,
	})
	rt.Dispatcher = d
	return rt
}

// memoryBudget is the process's budget for work that holds Session state:
// half of it for one namespace at most.
func memoryBudget(limit int64) *membudget.Budget {
	switch {
	case limit < 0:
		limit = 0 // no bound
	case limit == 0:
		limit = membudget.FromContainer(0.5, 512<<20)
	}
	return membudget.New(limit, 0.5)
}
