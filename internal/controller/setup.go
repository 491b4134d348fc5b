package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/controller/execution"
	"github.com/warmpool/warmpool/internal/controller/index"
	"github.com/warmpool/warmpool/internal/controller/modelendpoint"
	"github.com/warmpool/warmpool/internal/controller/pool"
	"github.com/warmpool/warmpool/internal/controller/session"
	"github.com/warmpool/warmpool/internal/dataplane"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/llm"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/servingcert"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/tenancy"
)

// DataPlaneCertSecret, in the manager's namespace, holds the data plane's
// serving certificate and CA (servingcert). The data plane's role may update
// this Secret alone (internal/dataplane/rbac.go names it; a test compares).
const DataPlaneCertSecret = "warmpool-data-plane-cert"

// Mode is which of the manager's parts a process runs.
type Mode string

const (
	// ModeAll runs the controllers and, when Config.DataPlane is set, the
	// data plane in one process: for a laptop, envtest and `make run`.
	ModeAll Mode = "all"
	// ModeControllers runs the reconcilers, the dispatcher and the
	// Executions' runs, under leader election: the controller-manager
	// Deployment.
	ModeControllers Mode = "controllers"
	// ModeDataPlane serves only the Sessions data plane, with no lease to
	// lose: the data-plane Deployment. A leader that is starved, restarts or
	// hands over does not take Ready Sessions' runs down with it.
	ModeDataPlane Mode = "data-plane"
)

// Modes are the valid values of Config.Mode.
var Modes = []Mode{ModeAll, ModeControllers, ModeDataPlane}

// Config is what the controllers need to know about where they run.
type Config struct {
	// Mode is which parts this process runs (ModeAll when empty).
	Mode Mode
	// ManagerNamespace holds the agent keys Secret; the pools' NetworkPolicies
	// admit agent calls only from pods there labelled sandboxpod.LabelAgentClient.
	ManagerNamespace string
	// AgentKeysSecret names that Secret (agentkeys.DefaultSecret when empty).
	AgentKeysSecret string
	// Resolver finds a pod's agent (the pod IP in a cluster).
	Resolver agentgate.Resolver
	// DataPlane, when set, serves the Sessions data plane (data.warmpool.dev)
	// from this process, in every replica; ModeDataPlane requires it and
	// ModeControllers ignores it.
	DataPlane *dataplane.Options
	// LLM calls the ModelEndpoints of pools' spec.llm (a client of its own when nil).
	LLM *llm.Client
	// AutoscaleWindow is the long window of autoscaled pools' claim rate
	// (the short one is a tenth of it); 0: 60 s. Tests shorten it.
	AutoscaleWindow time.Duration
	// Snapshots configures the store suspended Sessions go to; nil: none,
	// and no Session is suspended.
	Snapshots *Snapshots
	// SharedPoolNamespaces are the namespaces whose pools may be shared with
	// other namespaces (spec.sharing); nil: tenancy.DefaultSharedNamespaces,
	// empty: none.
	SharedPoolNamespaces tenancy.Namespaces
	// MemoryBudget is how many bytes forks, suspends and resumes may hold in
	// this process at once (internal/membudget): 0, half the container's
	// memory limit (512 MiB without one); negative, no bound.
	MemoryBudget int64
	// Clock decides the time policies of every reconciler (nil: the wall
	// clock): the autoscaler's windows and delays, idle timeouts, lifetimes,
	// TTLs, backoffs. Waits for real I/O (an agent's answer, the kubelet's
	// report) stay on the wall clock. Tests step it.
	Clock clock.PassiveClock
}

// Snapshots is where suspended Sessions' snapshots go, and the key they are sealed with.
type Snapshots struct {
	Store snapshotstore.Config
	// KeyFile holds the 32-byte key; empty: KeySecret in the manager's namespace.
	KeyFile   string
	KeySecret string
}

// store connects to the snapshot store with its key (nil, nil: none configured).
func (c Config) store(ctx context.Context, mgr ctrl.Manager) (*snapshotstore.Store, error) {
	if c.Snapshots == nil || !c.Snapshots.Store.Enabled() {
		return nil, nil
	}
	secret := c.Snapshots.KeySecret
	if secret == "" {
		secret = snapshotstore.DefaultKeySecret
	}
	key, err := snapshotstore.LoadKey(ctx, mgr.GetClient(), mgr.GetAPIReader(), c.Snapshots.KeyFile,
		types.NamespacedName{Namespace: c.ManagerNamespace, Name: secret})
	if err != nil {
		return nil, err
	}
	st, err := snapshotstore.New(c.Snapshots.Store, key)
	if err != nil {
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.EnsureBucket(bctx); err != nil {
		// Not fatal: the store may come up later; each suspend that fails says so.
		mgr.GetLogger().Info("the snapshot store does not answer yet; suspends fail until it does", "store", st.String(), "err", err.Error())
	}
	return st, nil
}

// KeysSecret is the agent keys Secret's name and namespace.
func (c Config) KeysSecret() types.NamespacedName {
	name := c.AgentKeysSecret
	if name == "" {
		name = agentkeys.DefaultSecret
	}
	return types.NamespacedName{Namespace: c.ManagerNamespace, Name: name}
}

// Setup registers with mgr, whose cache was made with
// CacheOptions(cfg.KeysSecret()), the parts of the manager cfg.Mode names.
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) error {
	mode := cfg.Mode
	if mode == "" {
		mode = ModeAll
	}
	controllers := mode == ModeAll || mode == ModeControllers
	dataPlane := (mode == ModeAll || mode == ModeDataPlane) && cfg.DataPlane != nil
	switch {
	case !slices.Contains(Modes, mode):
		return fmt.Errorf("mode %q: want one of %v", mode, Modes)
	case mode == ModeDataPlane && cfg.DataPlane == nil:
		return errors.New("mode data-plane serves the data plane: give it a port")
	}
	rt := newRuntime(cfg, mgr.GetClient())
	keys := rt.Keys

	// Both parts sign their calls to agents. Only the controllers create
	// the keys Secret when there is none: the data plane waits for it, and
	// its role cannot write it.
	var poolEvents chan event.GenericEvent
	if controllers {
		poolEvents = make(chan event.GenericEvent, 1024)
	}
	if err := (&agentkeys.Reconciler{
		Client: mgr.GetClient(), Secret: cfg.KeysSecret(), Keys: keys, PoolEvents: poolEvents, CreateMissing: controllers,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if controllers {
		if err := setupControllers(ctx, mgr, cfg, rt, poolEvents); err != nil {
			return err
		}
	}
	if dataPlane {
		return setupDataPlane(mgr, cfg, rt)
	}
	return nil
}

// setupControllers registers the indexes and the reconcilers, each given
// what it uses of the runtime. They run on the leader only.
func setupControllers(ctx context.Context, mgr ctrl.Manager, cfg Config, rt *Runtime, poolEvents chan event.GenericEvent) error {
	// Shared pools read tenants' namespace labels from the cache, under the
	// dispatcher's lock: start that informer now, not at its first read.
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.Namespace{}); err != nil {
		return fmt.Errorf("namespace informer: %w", err)
	}
	if err := index.Setup(ctx, mgr); err != nil {
		return err
	}
	if err := watchNodes(ctx, mgr, rt); err != nil {
		return err
	}
	keys := rt.Keys
	store, err := cfg.store(ctx, mgr)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	storeName := ""
	if store != nil {
		storeName = store.String()
	}
	if err := pool.NewReconciler(mgr, pool.Deps{
		Keys: keys, ManagerNamespace: cfg.ManagerNamespace, KeyEvents: poolEvents, Dispatcher: rt.Dispatcher,
		Autoscalers: rt.Autoscalers, Tenancy: rt.Tenancy, Agents: rt.Gate.Agents(), Clock: rt.Clock, DemandWakes: rt.poolWakes,
		SnapshotStore: storeName, Nodes: rt.Nodes,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if cfg.LLM == nil {
		cfg.LLM = llm.NewClient()
	}
	models := &modelendpoint.Endpoints{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: cfg.ManagerNamespace, LLM: cfg.LLM}
	if err := (&modelendpoint.Reconciler{Endpoints: models}).SetupWithManager(mgr); err != nil {
		return err
	}
	// When this manager became the leader: Executions created after it
	// cannot have been claimed by a leader before it (execution.Deps.LeadingSince).
	var leading atomic.Pointer[time.Time]
	if err := mgr.Add(manager.RunnableFunc(func(context.Context) error {
		now := time.Now()
		leading.Store(&now)
		return nil
	})); err != nil {
		return err
	}
	leadingSince := func() (time.Time, bool) {
		if t := leading.Load(); t != nil {
			return *t, true
		}
		return time.Time{}, false
	}
	if err := execution.NewReconciler(mgr, execution.Deps{Gate: rt.Gate, Runner: rt.Runner, Keys: keys, Dispatcher: rt.Dispatcher, Nodes: rt.Nodes,
		Tenancy: rt.Tenancy, Models: models, Clock: rt.Clock, Wakeups: rt.executionWakes, LeadingSince: leadingSince}).SetupWithManager(mgr); err != nil {
		return err
	}
	return session.NewReconciler(mgr, session.Deps{Gate: rt.Gate, Dispatcher: rt.Dispatcher, Tenancy: rt.Tenancy, Keys: keys,
		Clock: rt.Clock, Wakeups: rt.sessionWakes, Snapshots: store, Memory: rt.Memory, Nodes: rt.Nodes}).SetupWithManager(mgr)
}

// setupDataPlane registers the data plane and its serving certificate. They
// run in every replica, leader or not.
func setupDataPlane(mgr ctrl.Manager, cfg Config, rt *Runtime) error {
	keys := rt.Keys
	if cfg.LLM == nil {
		cfg.LLM = llm.NewClient()
	}
	// A pool's ModelEndpoint answers llm_query in a Session's runs as in its
	// Executions, when the caller does not answer the calls itself.
	models := &modelendpoint.Endpoints{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: cfg.ManagerNamespace, LLM: cfg.LLM}
	var certs dataplane.CertSource
	if cfg.DataPlane.CertDir == "" {
		m := &servingcert.Manager{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
			Secret:     types.NamespacedName{Namespace: cfg.ManagerNamespace, Name: DataPlaneCertSecret},
			APIService: dataplane.Version + "." + dataplane.Group, Clock: clock.RealClock{},
			Log: mgr.GetLogger().WithName("servingcert")}
		if err := mgr.Add(m); err != nil {
			return err
		}
		certs = m
	}
	srv := dataplane.NewServer(mgr, *cfg.DataPlane, dataplane.Deps{Gate: rt.Gate, KeysLoaded: keys.Loaded, Models: models, Certs: certs, Memory: rt.Memory,
		// The data plane's role may get namespaces, not watch them: it reads
		// a tenant's labels only for a one-call run on a shared pool.
		Tenancy: &tenancy.Gate{Namespaces: rt.Tenancy.Namespaces, Labels: tenancy.FromClient(mgr.GetAPIReader())}})
	// A replica without keys is not ready: the data plane's Service sends
	// callers only to replicas that can sign their calls to agents.
	if err := mgr.AddReadyzCheck("agent-keys", func(*http.Request) error {
		if !keys.Loaded() {
			return errors.New("agent signing keys not loaded yet")
		}
		return nil
	}); err != nil {
		return err
	}
	// A replica shutting down is not ready: its endpoint leaves the Service
	// while it still serves, and then drains (dataplane.Options). Nor is one
	// that does not listen yet, or could not yet tell its callers apart.
	if err := mgr.AddReadyzCheck("data-plane", func(*http.Request) error {
		if srv.Draining() {
			return errors.New("shutting down")
		}
		if !srv.Serving() {
			return errors.New("not serving yet: loading the callers' CA and the front proxy's configuration")
		}
		return nil
	}); err != nil {
		return err
	}
	return mgr.Add(srv)
}

// watchNodes feeds the runtime's node tracker, and has the pods on a node
// that changed judged again: an idle pod on a node that is cordoned, tainted
// or not Ready is no longer handed out, and its pool replaces it elsewhere;
// a Session on a drained node moves; a run or a Session on a node that
// stopped answering is lost.
func watchNodes(ctx context.Context, mgr ctrl.Manager, rt *Runtime) error {
	inf, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	c := mgr.GetClient()
	_, err = inf.AddEventHandler(rt.Nodes.Handler(func(node string) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.MatchingFields{index.PodNode: node}); err != nil {
			mgr.GetLogger().Error(err, "list the pods of a node that changed", "node", node)
			return
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			rt.Dispatcher.Recheck(p)
			rt.poolWakes.Wake(types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[sandboxpod.LabelPool]})
			if s := lease.Session(p); s != "" {
				// A drained node's Sessions move (session/move.go); a lost
				// node's are lost (session/check.go).
				rt.sessionWakes.Wake(types.NamespacedName{Namespace: lease.Tenant(p), Name: s})
			}
			if ex := p.Annotations[sandboxpod.AnnotationClaimedBy]; ex != "" && lease.ClaimedBy(p) != "" {
				// A run on a lost node is lost (execution/running.go).
				rt.executionWakes.Wake(types.NamespacedName{Namespace: lease.Tenant(p), Name: ex})
			}
		}
	}))
	if err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	return nil
}
