// Command manager runs the warmpool controllers, which keep SandboxPools warm
// and run Executions in them, and the Sessions data plane: both in one
// process (--mode=all), or each in its own Deployment (--mode=controllers
// under leader election, --mode=data-plane in every replica, with no lease).
// It never runs user code itself.
package main

import (
	"crypto/tls"
	"flag"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/dataplane"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/tenancy"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(sandboxv1alpha1.AddToScheme(scheme))
}

func main() {
	var (
		metricsAddr          string
		probeAddr            string
		enableLeaderElection bool
		leaderElectionNS     string
		secureMetrics        bool
		enableHTTP2          bool
		pprofAddr            string
		agentPort            int
		managerNamespace     string
		agentKeysSecret      string
		sharedPoolNamespaces string
		leaseDuration        time.Duration
		renewDeadline        time.Duration
		retryPeriod          time.Duration
		mode                 string
		snapshots            controller.Snapshots
		memoryBudget         int64
		apiQPS               float64
		apiBurst             int
	)
	flag.StringVar(&mode, "mode", string(controller.ModeAll),
		"Which parts to run: all; controllers (the reconcilers, under --leader-elect); data-plane (the Sessions data plane "+
			"alone, needs --data-plane-port, never elects a leader, so a leader change or a starved leader does not stop it).")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0",
		"Address of the metrics endpoint, e.g. :8443 (HTTPS) or :8080 (HTTP); 0 turns it off.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "0",
		"Address of Go's profiling endpoints (/debug/pprof/), unauthenticated: for a profile taken on purpose; 0 (the default) serves none.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false,
		"Elect a leader, so that only one of several manager replicas is active.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "",
		"Namespace of the leader election Lease; defaults to the manager's own namespace.")
	flag.DurationVar(&leaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long a follower waits after the leader's last renewal before it takes over.")
	flag.DurationVar(&renewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before it gives up leading.")
	flag.DurationVar(&retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often candidates try to acquire or renew.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true,
		"Serve metrics over HTTPS with authentication and authorization by the API server.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false,
		"Serve metrics over HTTP/2 too; off by default because of the HTTP/2 rapid reset CVEs.")
	flag.Float64Var(&apiQPS, "kube-api-qps", defaultAPIQPS,
		"Requests per second the manager's client may send to kube-apiserver, sustained (client-go's token bucket; "+
			"the API server's priority and fairness still applies).")
	flag.IntVar(&apiBurst, "kube-api-burst", defaultAPIBurst, "Requests the manager's client may send at once above --kube-api-qps.")
	var dataPlane dataplane.Options
	flag.IntVar(&dataPlane.Port, "data-plane-port", 0,
		"Port of the Sessions data plane (data.warmpool.dev, behind an APIService); 0 serves none.")
	flag.StringVar(&dataPlane.BindAddress, "data-plane-bind-address", "0.0.0.0", "Address the data plane listens on.")
	flag.StringVar(&dataPlane.CertDir, "data-plane-cert-dir", "",
		"Directory with the data plane's tls.crt and tls.key; empty: a self-signed certificate.")
	flag.StringVar(&dataPlane.RemoteKubeConfig, "data-plane-authentication-kubeconfig", "",
		"Kubeconfig of the cluster that authenticates and authorizes data-plane callers; empty: in-cluster.")
	flag.IntVar(&dataPlane.NamespaceSeats, "data-plane-namespace-seats", dataplane.DefaultNamespaceSeats,
		"Requests of one namespace a data-plane replica serves at once (a run holds one while its code runs); more wait in the namespace's queue. Negative: no limit.")
	flag.IntVar(&dataPlane.NamespaceQueue, "data-plane-namespace-queue", dataplane.DefaultNamespaceQueue,
		"Requests of one namespace that may wait for a seat in a data-plane replica; more are refused 429.")
	flag.DurationVar(&dataPlane.NamespaceQueueWait, "data-plane-namespace-queue-wait", dataplane.DefaultNamespaceQueueWait,
		"How long a data-plane request may wait for a seat of its namespace; then 429.")
	flag.Float64Var(&dataPlane.NamespaceRate, "data-plane-namespace-rate", dataplane.DefaultNamespaceRate,
		"Requests a second one namespace gets in a data-plane replica (one more for each 64 KiB a request moves); more wait their turn, for at most the queue's wait, then 429. Negative: no limit.")
	flag.IntVar(&dataPlane.NamespaceBurst, "data-plane-namespace-burst", dataplane.DefaultNamespaceBurst,
		"Requests one namespace may save up in a data-plane replica, beyond --data-plane-namespace-rate.")
	flag.IntVar(&agentPort, "agent-port", sandboxpod.AgentPort, "Port of the sandbox agents in their pods.")
	flag.StringVar(&managerNamespace, "manager-namespace", ownNamespace(),
		"Namespace of the manager: it holds the agent keys Secret, and the pools' NetworkPolicies admit agent calls from "+
			"pods there labelled "+sandboxpod.LabelAgentClient+"=true.")
	flag.StringVar(&agentKeysSecret, "agent-keys-secret", agentkeys.DefaultSecret,
		"Secret in the manager's namespace with the keys agent tokens are signed with (created when missing).")
	opts := zap.Options{Development: false}
	flag.StringVar(&sharedPoolNamespaces, "shared-pool-namespaces", strings.Join(tenancy.DefaultSharedNamespaces, ","),
		"Comma-separated namespaces whose SandboxPools may be shared with other namespaces (spec.sharing). "+
			"Whoever controls such a namespace can read every tenant's code: list only namespaces the platform team owns. \"\": none.")
	flag.StringVar(&snapshots.Store.Endpoint, "snapshot-store-endpoint", "",
		"host:port of the S3-compatible object store suspended Sessions' snapshots go to; empty: no Session is suspended. "+
			"Credentials come from the environment: WARMPOOL_SNAPSHOT_STORE_ACCESS_KEY_ID and WARMPOOL_SNAPSHOT_STORE_SECRET_ACCESS_KEY.")
	flag.StringVar(&snapshots.Store.Bucket, "snapshot-store-bucket", "warmpool-snapshots", "Bucket of the snapshot store (created when missing and allowed).")
	flag.StringVar(&snapshots.Store.Region, "snapshot-store-region", "us-east-1", "Region of the snapshot store.")
	flag.StringVar(&snapshots.Store.Prefix, "snapshot-store-prefix", "warmpool/", "Prefix of the snapshots' object keys.")
	flag.BoolVar(&snapshots.Store.Insecure, "snapshot-store-insecure", false, "Speak plain HTTP to the snapshot store (a store inside the cluster network).")
	flag.Int64Var(&snapshots.Store.MaxBytes, "snapshot-max-bytes", 64<<20,
		"Largest snapshot a Session is suspended with (a larger one keeps its pod). The controllers hold a snapshot twice in memory while they seal it: raise their memory limit with it.")
	flag.StringVar(&snapshots.KeyFile, "snapshot-key-file", "",
		"File holding the 32-byte key snapshots are sealed with; empty: the Secret --snapshot-key-secret, created with a random key when missing.")
	flag.Int64Var(&memoryBudget, "memory-budget", 0,
		"Bytes of this process's memory forks, suspends and resumes may hold at once, one namespace at most half; past it they are refused "+
			"(429 with Retry-After, a later look). 0: half the container's memory limit (512 MiB without one); negative: no bound.")
	flag.StringVar(&snapshots.KeySecret, "snapshot-key-secret", "warmpool-snapshot-key", "Secret, in the manager's namespace, holding the snapshot key.")
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	// In a cluster, sandboxes hold back their readiness until a dial to the API
	// server's Service fails: their pool's NetworkPolicy is in force.
	if h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
		sandboxpod.EgressCanary = net.JoinHostPort(h, p)
	}

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{
		BindAddress:   metricsAddr,
		SecureServing: secureMetrics,
		TLSOpts:       tlsOpts,
	}
	if secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	switch {
	case mode == string(controller.ModeDataPlane) && enableLeaderElection:
		setupLog.Error(nil, "--mode=data-plane runs in every replica: drop --leader-elect")
		os.Exit(1)
	case mode == string(controller.ModeControllers) && dataPlane.Port != 0:
		setupLog.Error(nil, "--mode=controllers serves no data plane: drop --data-plane-port, or use --mode=all")
		os.Exit(1)
	}
	cfg := controller.Config{Mode: controller.Mode(mode), ManagerNamespace: managerNamespace, AgentKeysSecret: agentKeysSecret,
		Resolver: agentgate.PodIPResolver{Port: agentPort}, SharedPoolNamespaces: tenancy.ParseNamespaces(sharedPoolNamespaces),
		MemoryBudget: memoryBudget}
	if cfg.SharedPoolNamespaces == nil {
		cfg.SharedPoolNamespaces = tenancy.Namespaces{} // "" is none, not the default
	}
	if snapshots.Store.Enabled() {
		snapshots.Store.AccessKeyID = os.Getenv("WARMPOOL_SNAPSHOT_STORE_ACCESS_KEY_ID")
		snapshots.Store.SecretAccessKey = os.Getenv("WARMPOOL_SNAPSHOT_STORE_SECRET_ACCESS_KEY")
		cfg.Snapshots = &snapshots
	}
	if dataPlane.Port != 0 {
		dataPlane.AlternateDNS = []string{"warmpool-data-plane." + managerNamespace + ".svc"}
		cfg.DataPlane = &dataPlane
	}
	restConfig := ctrl.GetConfigOrDie()
	restConfig.QPS, restConfig.Burst = float32(apiQPS), apiBurst
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controller.CacheOptions(cfg.KeysSecret()),
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        probeAddr,
		PprofBindAddress:              pprofAddr,
		LeaderElection:                enableLeaderElection,
		LeaderElectionID:              "manager.warmpool.dev",
		LeaderElectionNamespace:       leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
	})
	if err != nil {
		setupLog.Error(err, "unable to create manager")
		os.Exit(1)
	}

	ctx := ctrl.SetupSignalHandler()
	// Every replica loads the agent keys; a data plane, in every replica,
	// serves with its certificate; only the leader runs the reconcilers, the
	// dispatcher and the Executions' runs (controller.Runtime says which part
	// is which).
	if err := controller.Setup(ctx, mgr, cfg); err != nil {
		setupLog.Error(err, "unable to set up the controllers")
		os.Exit(1)
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up ready check")
		os.Exit(1)
	}

	setupLog.Info("starting manager", "mode", cfg.Mode, "namespace", managerNamespace, "agentKeys", cfg.KeysSecret().String())
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "problem running manager")
		os.Exit(1)
	}
}

// The client's default rate. controller-runtime's (20/s, burst 30) held a
// manager serving 75 new Sessions a second, about 3.5 requests each, to a
// p50 of 15 s (docs/scale.md); this leaves room for 75/s and their pods'
// replacements. kube-apiserver's priority and fairness still protects it.
const (
	defaultAPIQPS   = 300
	defaultAPIBurst = 600
)

// ownNamespace is the manager's namespace: $POD_NAMESPACE (the Deployment sets
// it from the downward API), else the service account's, else warmpool-system.
func ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
		return strings.TrimSpace(string(b))
	}
	return "warmpool-system"
}
