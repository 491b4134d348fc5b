package controller

import (
	"context"
	"errors"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/controller/execution"
	"github.com/warmpool/warmpool/internal/controller/index"
	"github.com/warmpool/warmpool/internal/controller/modelendpoint"
	"github.com/warmpool/warmpool/internal/controller/pool"
	"github.com/warmpool/warmpool/internal/controller/session"
	"github.com/warmpool/warmpool/internal/dataplane"
	"github.com/warmpool/warmpool/internal/llm"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/internal/servingcert"
)

// DataPlaneCertSecret, in the manager's namespace, holds the data plane's
// serving certificate and CA (servingcert).
const DataPlaneCertSecret = "warmpool-data-plane-cert"

// The data plane's certificate: its Secret in the manager's namespace, and the
// APIService whose caBundle trusts it.
// +kubebuilder:rbac:groups="",namespace=warmpool-system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;patch,resourceNames=v1alpha1.data.warmpool.dev

// Config is what the controllers need to know about where they run.
type Config struct {
	// ManagerNamespace holds the agent keys Secret; the pools' NetworkPolicies
	// admit agent calls only from pods there labelled sandboxpod.LabelAgentClient.
	ManagerNamespace string
	// AgentKeysSecret names that Secret (agentkeys.DefaultSecret when empty).
	AgentKeysSecret string
	// Resolver finds a pod's agent (the pod IP in a cluster).
	Resolver runner.Resolver
	// DataPlane, when set, serves the Sessions data plane (data.warmpool.dev)
	// from this manager, in every replica.
	DataPlane *dataplane.Options
	// LLM calls the ModelEndpoints of pools' spec.llm (a client of its own when nil).
	LLM *llm.Client
	// AutoscaleWindow is the long window of autoscaled pools' claim rate
	// (the short one is a tenth of it); 0: 60 s. Tests shorten it.
	AutoscaleWindow time.Duration
	// Clock decides the time policies of every reconciler (nil: the wall
	// clock): the autoscaler's windows and delays, idle timeouts, lifetimes,
	// TTLs, backoffs. Waits for real I/O (an agent's answer, the kubelet's
	// report) stay on the wall clock. Tests step it.
	Clock clock.PassiveClock
}

// KeysSecret is the agent keys Secret's name and namespace.
func (c Config) KeysSecret() types.NamespacedName {
	name := c.AgentKeysSecret
	if name == "" {
		name = agentkeys.DefaultSecret
	}
	return types.NamespacedName{Namespace: c.ManagerNamespace, Name: name}
}

// Setup registers the cache indexes and all warmpool controllers with mgr,
// whose cache was made with CacheOptions(cfg.KeysSecret()).
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) error {
	if err := index.Setup(ctx, mgr); err != nil {
		return err
	}
	rt := newRuntime(cfg)
	keys := rt.Keys

	// Every replica: the keys, and below, the data plane and its certificate.
	poolEvents := make(chan event.GenericEvent, 1024)
	if err := (&agentkeys.Reconciler{
		Client: mgr.GetClient(), Secret: cfg.KeysSecret(), Keys: keys, PoolEvents: poolEvents,
	}).SetupWithManager(mgr); err != nil {
		return err
	}

	// The leader: the reconcilers, each given what it uses of the runtime.
	if err := (&pool.Reconciler{
		Client: mgr.GetClient(), Keys: keys, ManagerNamespace: cfg.ManagerNamespace, KeyEvents: poolEvents,
		Dispatcher: rt.Dispatcher, Autoscalers: rt.Autoscalers, Clock: rt.Clock, DemandWakes: rt.poolWakes,
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
	if err := (&execution.Reconciler{Client: mgr.GetClient(), Resolver: rt.Resolver, Keys: keys, Dispatcher: rt.Dispatcher,
		Runner: rt.Runner, Models: models, Clock: rt.Clock, Wakeups: rt.executionWakes}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&session.Reconciler{Client: mgr.GetClient(), Resolver: rt.Resolver, Runner: rt.Runner, Dispatcher: rt.Dispatcher,
		Keys: keys, Clock: rt.Clock, Wakeups: rt.sessionWakes}).SetupWithManager(mgr); err != nil {
		return err
	}
	if cfg.DataPlane == nil {
		return nil
	}
	srv := &dataplane.Server{Options: *cfg.DataPlane, Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runner: rt.Runner,
		KeysLoaded: keys.Loaded, Keys: keys, Resolver: rt.Resolver, Log: mgr.GetLogger().WithName("dataplane")}
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
	if cfg.DataPlane.CertDir == "" {
		certs := &servingcert.Manager{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
			Secret:     types.NamespacedName{Namespace: cfg.ManagerNamespace, Name: DataPlaneCertSecret},
			APIService: dataplane.Version + "." + dataplane.Group, Clock: clock.RealClock{},
			Log: mgr.GetLogger().WithName("servingcert")}
		if err := mgr.Add(certs); err != nil {
			return err
		}
		srv.Certs = certs
	}
	return mgr.Add(srv)
}
