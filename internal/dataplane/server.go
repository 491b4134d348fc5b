// Package dataplane serves the Sessions data plane: an aggregated API,
// data.warmpool.dev/v1alpha1, through which callers run code in a Ready
// Session, stream its output, answer its llm_query calls, interrupt it, read
// its variables and files and reset it, with no API write per run.
//
// kube-apiserver's aggregation layer authenticates the caller (any kubeconfig
// credential: client certificates, tokens, exec plugins) and passes the user
// on in front-proxy headers, which this server accepts only over a client
// certificate signed by the cluster's request-header CA. Every request is
// authorised with a SubjectAccessReview as a verb on a subresource of
// "sessions" in data.warmpool.dev (POST .../sessions/NAME/exec is "create
// sessions/exec"), so RBAC on the Session decides. The same server answers
// callers that reach it directly with a bearer token (TokenReview), which is
// how the benchmark measures the aggregator's hop.
//
// The server keeps no state: it finds the Session's pod in the manager's
// cache and calls that pod's agent with a token for that pod alone, so it
// runs in every manager replica, leader or not.
package dataplane

import (
	"cmp"
	"context"
	"fmt"
	corev1 "k8s.io/api/core/v1"
	"net"
	"net/http"
	"path/filepath"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/pkg/protocol"

	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/membudget"
	"github.com/warmpool/warmpool/internal/nodes"
	"github.com/warmpool/warmpool/internal/tenancy"
)

// Group and Version of the data plane's API.
const (
	Group   = "data.warmpool.dev"
	Version = "v1alpha1"
)

// Options say where and how the server listens and whom it asks about callers.
type Options struct {
	// BindAddress and Port of the HTTPS listener.
	BindAddress string
	Port        int
	// CertDir holds tls.crt and tls.key, and whoever provides them sets the
	// APIService's caBundle; empty: the manager issues the certificate and
	// sets the caBundle (Server.Certs), serving a self-signed certificate for
	// AlternateDNS until it has.
	CertDir      string
	AlternateDNS []string
	// RemoteKubeConfig is the cluster to delegate authentication and
	// authorisation to; empty: the in-cluster configuration.
	RemoteKubeConfig string
	// On shutdown the replica first reports not ready and still takes
	// requests for ShutdownDelay (while its endpoint leaves the Service and
	// kube-apiserver's aggregator stops sending it any), then stops
	// listening and lets the runs it streams end for up to DrainTimeout;
	// those still open are cut then, and their callers re-attach through
	// another replica by run id (pkg/sessions, the Python client). Zero:
	// DefaultShutdownDelay, DefaultDrainTimeout. A negative DrainTimeout
	// waits for nothing: the listener closes at once and open requests end
	// in the background, so that a stop stands for a crash (tests stop a
	// manager whose controllers must stop with it).
	ShutdownDelay, DrainTimeout time.Duration
	// NamespaceSeats is how many of this replica's requests one namespace
	// may hold at once; NamespaceQueue how many more may wait for a seat,
	// for at most NamespaceQueueWait (fairness.go). Zero: the defaults;
	// NamespaceSeats negative: no limit.
	NamespaceSeats, NamespaceQueue int
	NamespaceQueueWait             time.Duration
	// NamespaceRate is the requests a second one namespace gets in this
	// replica, saving up at most NamespaceBurst (spend.go). Zero: the
	// defaults; NamespaceRate negative: no limit.
	NamespaceRate  float64
	NamespaceBurst int
}

// The shutdown defaults fit in the Deployment's 30 s termination grace
// period and controller-runtime's 30 s graceful shutdown.
const (
	DefaultShutdownDelay = 3 * time.Second
	DefaultDrainTimeout  = 20 * time.Second
)

// Server is the data plane. It implements controller-runtime's Runnable.
type Server struct {
	Options Options
	// serving: listening, with the callers' CA and the front proxy's
	// configuration loaded; draining: shutting down.
	serving, draining atomic.Bool
	// Client reads Sessions and pods (the manager's cache) and writes a
	// Session's interpreter when a caller resets it.
	Client client.Client
	// APIReader reads around the cache when the cache says no: a caller who
	// just saw its Session Ready must not be told it is Pending.
	APIReader client.Reader
	// Gate opens a Session's pod's agent (agentgate): the calls are signed
	// there, and made only to the pod the Session holds.
	Gate *agentgate.Gate
	// Tenancy refuses a one-call run a shared pool does not admit, at once
	// (nil: pools of the caller's namespace only).
	Tenancy *tenancy.Gate
	// KeysLoaded reports whether the agent signing keys are loaded; until
	// then every Session request is answered 503, so a caller retries
	// instead of reading a failed call to its agent as a broken sandbox.
	// Nil: always.
	KeysLoaded func() bool
	// Certs, when set, is the serving certificate the APIService trusts
	// (servingcert); until it has one the server serves a self-signed one.
	Certs CertSource
	// Models answers the code's llm_query calls from the pool's
	// ModelEndpoint (spec.llm) when the caller does not answer them itself,
	// as the manager does for an Execution of the pool. Nil: the caller's.
	Models Models
	// Informers deliver the Session changes one-call runs wait for (the
	// manager's cache); nil: they look every second.
	Informers cache.Informers
	// Memory admits forks by the bytes they hold (nil: no bound).
	Memory *membudget.Budget
	Log    logr.Logger

	authorizer authorizer.Authorizer
	ready      sessionChanges
	idle       idlePods
	// nodes: which nodes a one-call run may claim an idle pod on (internal/nodes).
	nodes   *nodes.Tracker
	warming chan struct{} // warm.go
	// cacheLag overrides the package's cacheLag (tests).
	cacheLag time.Duration
	seats    *seats
	spend    *spend
	forking  sync.Map // Session UIDs with a fork under way
	// frontProxy is how the aggregator's relayed callers are authenticated
	// (nil when no request-header configuration is delegated).
	frontProxy *authenticatorfactory.RequestHeaderConfig
}

// Deps is what the data plane is built with, besides its manager.
type Deps struct {
	Gate       *agentgate.Gate
	KeysLoaded func() bool
	Models     Models
	Tenancy    *tenancy.Gate
	Certs      CertSource
	Memory     *membudget.Budget
}

// NewServer returns the data plane of mgr (its cache, API reader and
// logger) serving with o.
func NewServer(mgr manager.Manager, o Options, d Deps) *Server {
	return &Server{Options: o, Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Informers: mgr.GetCache(),
		Log: mgr.GetLogger().WithName("dataplane"), Gate: d.Gate, KeysLoaded: d.KeysLoaded, Models: d.Models,
		Tenancy: d.Tenancy, Certs: d.Certs, Memory: d.Memory, seats: o.seats(), spend: o.spend(), warming: make(chan struct{}, warmConcurrency),
		nodes: nodes.New()}
}

// seats is the per-namespace fairness o asks for (nil: none).
func (o Options) seats() *seats {
	if o.NamespaceSeats < 0 {
		return nil
	}
	return newSeats(positiveOr(o.NamespaceSeats, DefaultNamespaceSeats), positiveOr(o.NamespaceQueue, DefaultNamespaceQueue), o.queueWait())
}

// spend is the per-namespace rate o asks for (nil: none).
func (o Options) spend() *spend {
	if o.NamespaceRate < 0 {
		return nil
	}
	return newSpend(positiveOr(o.NamespaceRate, DefaultNamespaceRate), positiveOr(o.NamespaceBurst, DefaultNamespaceBurst), o.queueWait())
}

// queueWait bounds how long a request waits for a seat, and for its turn.
func (o Options) queueWait() time.Duration {
	return positiveOr(o.NamespaceQueueWait, DefaultNamespaceQueueWait)
}

// positiveOr is v, or def when v is not positive (unset).
func positiveOr[T int | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Models gives the answerer of a pool's ModelEndpoint (nil when the pool
// names none) and the endpoint's bound on calls per run.
type Models interface {
	Bridge(ctx context.Context, pool *sandboxv1alpha1.SandboxPool) (func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer, int)
}

// CertSource provides the serving certificate and can be made current.
type CertSource interface {
	dynamiccertificates.CertKeyContentProvider
	Ensure(ctx context.Context) error
}

// NeedLeaderElection is false: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	if s.Certs != nil {
		// Serve the certificate the APIService trusts from the first request.
		if err := s.Certs.Ensure(ctx); err != nil {
			s.Log.Info("serving a self-signed certificate until the APIService's is issued", "reason", err.Error())
		}
	}
	handler, serving, err := s.build()
	if err != nil {
		return err
	}
	// Until the client CA is loaded a caller's certificate is not asked for,
	// and until the front proxy's CA and headers are, the aggregator's
	// callers are not recognised: either way a caller would be served as
	// system:anonymous (403), and an aggregator connection made meanwhile
	// keeps its certificate-less handshake. Both are read by controllers
	// that watch kube-system/extension-apiserver-authentication (their
	// RunOnce reads that watch's cache, empty before it starts), which Serve
	// would start only as it listens: run them here, listen once they have
	// it (awaitCallers), and hide them from Serve so that it does not start
	// a second set of watches.
	if ca, ok := serving.ClientCA.(dynamiccertificates.ControllerRunner); ok {
		go ca.Run(ctx, 1)
		serving.ClientCA = started{serving.ClientCA}
	}
	s.awaitCallers(ctx)
	if s.Informers != nil {
		inf, err := s.Informers.GetInformer(ctx, &sandboxv1alpha1.Session{})
		if err != nil {
			return fmt.Errorf("watch Sessions for one-call runs: %w", err)
		}
		if _, err := inf.AddEventHandler(s.ready.handler()); err != nil {
			return fmt.Errorf("watch Sessions for one-call runs: %w", err)
		}
		if _, err := inf.AddEventHandler(s.warmer()); err != nil {
			return fmt.Errorf("watch Sessions to warm their agents up: %w", err)
		}
		pods, err := s.Informers.GetInformer(ctx, &corev1.Pod{})
		if err != nil {
			return fmt.Errorf("watch pods for one-call runs: %w", err)
		}
		if _, err := pods.AddEventHandler(s.idle.handler()); err != nil {
			return fmt.Errorf("watch pods for one-call runs: %w", err)
		}
		if _, err := pods.AddEventHandler(s.ready.podHandler()); err != nil {
			return fmt.Errorf("watch pods for the claims of Sessions: %w", err)
		}
		if s.Gate != nil {
			if _, err := pods.AddEventHandler(s.agentsAhead()); err != nil {
				return fmt.Errorf("watch pods to ask their agents ahead: %w", err)
			}
		}
		nodeInf, err := s.Informers.GetInformer(ctx, &corev1.Node{})
		if err != nil {
			return fmt.Errorf("watch nodes for one-call runs: %w", err)
		}
		if _, err := nodeInf.AddEventHandler(s.nodes.Handler(nil)); err != nil {
			return fmt.Errorf("watch nodes for one-call runs: %w", err)
		}
	}
	s.Log.Info("data plane serving", "addr", serving.Listener.Addr().String())
	delay, drain := cmp.Or(s.Options.ShutdownDelay, DefaultShutdownDelay), cmp.Or(s.Options.DrainTimeout, DefaultDrainTimeout)
	if drain < 0 {
		if _, _, err := serving.Serve(handler, 5*time.Second, ctx.Done()); err != nil {
			return fmt.Errorf("serve the data plane: %w", err)
		}
		s.serving.Store(true)
		<-ctx.Done()
		s.draining.Store(true)
		return nil
	}
	stop := make(chan struct{})
	stopped, _, err := serving.Serve(handler, drain, stop)
	if err != nil {
		return fmt.Errorf("serve the data plane: %w", err)
	}
	s.serving.Store(true)
	<-ctx.Done()
	s.draining.Store(true)
	s.Log.Info("shutting down: not ready, still serving for a moment, then draining open runs", "delay", delay, "drainTimeout", drain)
	time.Sleep(delay)
	close(stop)
	<-stopped
	s.Log.Info("data plane stopped")
	return nil
}

// awaitCallers waits, for at most frontProxyWait, until the replica can
// tell who calls it; after that it serves whatever it has, so that one
// without a front proxy (called directly) is not held forever.
func (s *Server) awaitCallers(ctx context.Context) {
	if err := awaitFrontProxy(ctx, s.frontProxy, 50*time.Millisecond, frontProxyWait); err != nil && ctx.Err() == nil {
		s.Log.Info("serving without the front proxy's configuration; loading it in the background", "err", err.Error())
	}
}

// started is a CA whose controllers already run: only its content and
// change notices show.
type started struct {
	dynamiccertificates.CAContentProvider
}

// frontProxyWait bounds how long a starting replica waits for the front
// proxy's configuration.
const frontProxyWait = 30 * time.Second

// Draining reports whether the replica is shutting down: its readiness
// check fails, so that callers are sent to the other replicas.
func (s *Server) Draining() bool { return s.draining.Load() }

// Serving reports whether the replica listens and can tell who calls it:
// until then its readiness check fails too.
func (s *Server) Serving() bool { return s.serving.Load() }

// build wires the delegated authentication and authorisation of
// k8s.io/apiserver around the handlers, without a GenericAPIServer: the data
// plane stores nothing, so it needs none of its storage, admission or OpenAPI.
func (s *Server) build() (http.Handler, *server.SecureServingInfo, error) {
	ss := options.NewSecureServingOptions()
	ss.BindAddress = net.ParseIP(s.Options.BindAddress)
	if ss.BindAddress == nil {
		ss.BindAddress = net.IPv4zero
	}
	ss.BindPort = s.Options.Port
	if s.Options.CertDir != "" {
		ss.ServerCert.CertKey.CertFile = filepath.Join(s.Options.CertDir, "tls.crt")
		ss.ServerCert.CertKey.KeyFile = filepath.Join(s.Options.CertDir, "tls.key")
	} else {
		ss.ServerCert.CertDirectory, ss.ServerCert.PairName = "", ""
		if err := ss.MaybeDefaultWithSelfSignedCerts("localhost", s.Options.AlternateDNS, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
			return nil, nil, fmt.Errorf("self-signed certificate for the data plane: %w", err)
		}
	}
	var serving *server.SecureServingInfo
	if err := ss.ApplyTo(&serving); err != nil {
		return nil, nil, fmt.Errorf("data plane listener: %w", err)
	}
	if serving == nil {
		return nil, nil, fmt.Errorf("data plane listener: no port to bind")
	}
	if s.Certs != nil && s.Options.CertDir == "" {
		serving.Cert = &preferred{primary: s.Certs, fallback: serving.Cert}
	}
	authnOpts := options.NewDelegatingAuthenticationOptions()
	authnOpts.RemoteKubeConfigFile = s.Options.RemoteKubeConfig
	var authn server.AuthenticationInfo
	if err := authnOpts.ApplyTo(&authn, serving, nil); err != nil {
		return nil, nil, fmt.Errorf("data plane authentication: %w", err)
	}
	authzOpts := options.NewDelegatingAuthorizationOptions()
	authzOpts.RemoteKubeConfigFile = s.Options.RemoteKubeConfig
	// Discovery names nothing secret, and the aggregator asks for it (and for
	// OpenAPI, of which there is none) as a user without groups, whom RBAC's
	// system:discovery binding would not match.
	authzOpts.AlwaysAllowPaths = append(authzOpts.AlwaysAllowPaths, "/openapi/*", "/apis", "/apis/"+Group, prefix)
	var authz server.AuthorizationInfo
	if err := authzOpts.ApplyTo(&authz); err != nil {
		return nil, nil, fmt.Errorf("data plane authorization: %w", err)
	}
	s.authorizer = authz.Authorizer
	s.frontProxy = authn.RequestHeaderConfig
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, metav1.Unversioned)
	codecs := serializer.NewCodecFactory(scheme)

	var h http.Handler = s.routes()
	h = filters.WithAuthorization(h, authz.Authorizer, codecs)
	h = filters.WithAuthentication(h, withFrontProxyCache(authn.RequestHeaderConfig, authn.Authenticator), filters.Unauthorized(codecs), nil, authn.RequestHeaderConfig)
	h = filters.WithRequestInfo(h, &request.RequestInfoFactory{
		APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")})
	return h, serving, nil
}

// preferred serves primary's pair once it has one, fallback's until then.
type preferred struct {
	primary, fallback dynamiccertificates.CertKeyContentProvider
}

func (p *preferred) Name() string { return p.primary.Name() }

func (p *preferred) CurrentCertKeyContent() ([]byte, []byte) {
	if cert, key := p.primary.CurrentCertKeyContent(); len(cert) > 0 {
		return cert, key
	}
	return p.fallback.CurrentCertKeyContent()
}

func (p *preferred) AddListener(l dynamiccertificates.Listener) { p.primary.AddListener(l) }
