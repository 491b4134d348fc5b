// Command scale measures warmpool at the size of a large cluster on one
// machine: a real kube-apiserver and etcd (envtest's, built from Go modules),
// the real kube-scheduler, kwok playing hundreds of nodes and the kubelet of
// thousands of pods, and the real manager binary as its own process. kwok's
// pods run nothing, so a fleet of stand-in agents (test/scale/fleet) answers
// the manager at every pod's IP with the agent's HTTP API; no Python runs,
// and the real agent path is measured by the other benchmarks
// (docs/performance.md). What is measured is the control plane: the
// manager's leases, dispatch, caches and API traffic.
//
// Scenarios (docs/scale.md has their numbers):
//
//	make scale SCALE_ARGS='-scenario claims -nodes 100 -warm 1050 -rate 75 -duration 10s -gate-p99 1s'
//	make scale SCALE_ARGS='-scenario fill -nodes 500 -pools 1000 -pool-size 10'
//	make scale SCALE_ARGS='-scenario executions -nodes 100 -pools 100 -pool-size 10 -rate 100 -duration 20s'
//	make scale SCALE_ARGS='-scenario failover -nodes 500 -warm 10000 -sessions 5000'
//	make scale SCALE_ARGS='-scenario nodeloss -nodes 100 -warm 1050 -sessions 1000 -lost-nodes 10'
//
// It needs kwok and kube-scheduler (make scale builds both, pinned, from Go
// modules) and prints a Markdown report; -json writes the numbers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/sandboxpod"
)

type options struct {
	scenario     string
	kwok         string
	scheduler    string
	nodes        int
	podsPerNode  int
	podStartup   time.Duration
	apiInflight  int
	schedulerQPS int
	managerQPS   int
	managerBurst int
	managerArgs  string
	// managerBin, when set, is a manager binary built elsewhere (another
	// build, side by side with this one's); reuse the pools' reusePolicy.
	managerBin, reuse string

	warm     int
	rate     float64
	duration time.Duration
	gateP99  time.Duration
	gateP50  time.Duration
	seed     int64
	noRefill bool

	pools     int
	poolSize  int
	sessions  int
	lostNodes int

	jsonOut  string
	pprofDir string
	plot     string
	keep     bool
}

func main() {
	var o options
	flag.StringVar(&o.scenario, "scenario", "claims", "claims, fill, executions, failover or nodeloss")
	flag.StringVar(&o.kwok, "kwok", "", "the kwok binary (make scale builds it)")
	flag.StringVar(&o.scheduler, "kube-scheduler", "", "the kube-scheduler binary (hack/k8s-binaries.sh build kube-scheduler)")
	flag.IntVar(&o.nodes, "nodes", 100, "simulated nodes")
	flag.IntVar(&o.podsPerNode, "pods-per-node", 110, "pods a node has room for (the kubelet's default maximum)")
	flag.DurationVar(&o.podStartup, "pod-startup", 2*time.Second, "how long a simulated pod takes from its IP to Ready (image pull, sandbox boot)")
	flag.IntVar(&o.apiInflight, "api-max-requests-inflight", 800, "kube-apiserver --max-requests-inflight (mutating: half)")
	flag.IntVar(&o.schedulerQPS, "scheduler-qps", 1000, "kube-scheduler --kube-api-qps (burst: twice)")
	flag.IntVar(&o.managerQPS, "manager-qps", 0, "the manager's --kube-api-qps; 0: its default")
	flag.IntVar(&o.managerBurst, "manager-burst", 0, "the manager's --kube-api-burst (with -manager-qps)")
	flag.StringVar(&o.managerBin, "manager-bin", "", "run this manager binary instead of building cmd/manager (a previous build, side by side)")
	flag.StringVar(&o.reuse, "reuse", "", "fill, executions: the pools' reusePolicy (Never, the default, or FreshInterpreter)")
	flag.StringVar(&o.managerArgs, "manager-args", "", "more flags for the manager, space-separated (e.g. --zap-log-level=1 for its lease timings)")
	flag.IntVar(&o.warm, "warm", 1050, "claims, failover: warm pods of the pool")
	flag.Float64Var(&o.rate, "rate", 75, "claims, executions: arrivals per second (Poisson, open loop)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "claims, executions: how long arrivals come")
	flag.DurationVar(&o.gateP99, "gate-p99", 0, "claims: fail when the client's create → Ready p99 is above this (0: no gate)")
	flag.DurationVar(&o.gateP50, "gate-p50", 0, "claims: fail when the client's create → Ready p50 is above this (0: no gate)")
	flag.Int64Var(&o.seed, "seed", 1, "seed of the arrivals")
	flag.BoolVar(&o.noRefill, "no-refill", false, "claims: cap the pool at its warm pods (maxPods), so that no pod is started during the claims: the claim path alone")
	flag.IntVar(&o.pools, "pools", 1000, "fill, executions: pools")
	flag.IntVar(&o.poolSize, "pool-size", 10, "fill, executions: warm pods per pool")
	flag.IntVar(&o.sessions, "sessions", 5000, "failover, nodeloss: Ready Sessions before the leader is killed, or the nodes lost")
	flag.IntVar(&o.lostNodes, "lost-nodes", 10, "nodeloss: nodes that stop answering at once")
	flag.StringVar(&o.jsonOut, "json", "", "write the numbers to this file")
	flag.StringVar(&o.plot, "plot", "", "claims: write an SVG of the create → Ready distribution here")
	flag.StringVar(&o.pprofDir, "pprof-dir", "", "save the manager's CPU and heap profiles here")
	flag.BoolVar(&o.keep, "keep", false, "keep the run's directory (logs, kubeconfig)")
	flag.Parse()
	if o.kwok == "" || o.scheduler == "" {
		fmt.Fprintln(os.Stderr, "scale: -kwok and -kube-scheduler are required (make scale builds and passes them)")
		os.Exit(2)
	}
	ctrl.SetLogger(logr.Discard()) // the harness's own clients; the manager logs to its file
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := run(ctx, o)
	if rep != nil {
		fmt.Println(rep.markdown())
		if o.jsonOut != "" {
			data, _ := json.MarshalIndent(rep, "", "  ")
			if werr := os.WriteFile(o.jsonOut, data, 0o600); werr != nil {
				fmt.Fprintln(os.Stderr, "scale:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		if errors.As(err, new(latencyMissed)) {
			os.Exit(exitLatencyMissed)
		}
		os.Exit(1)
	}
}

// latencyMissed is a gate's latency bar missed, with every Session Ready:
// the one failure another run may overrule (make test-scale). Anything
// else (a Session not Ready, a create refused) fails at once.
type latencyMissed struct{ error }

func (l latencyMissed) Unwrap() error { return l.error }

// exitLatencyMissed is the exit code of a run that only missed a latency bar.
const exitLatencyMissed = 3

// env is what every scenario runs on.
type env struct {
	o       options
	cluster *cluster
	fleet   *fleetWatch
	binary  string // the manager's
	dir     string
}

func run(ctx context.Context, o options) (*report, error) {
	started := time.Now()
	c, err := startCluster(ctx, clusterOptions{nodes: o.nodes, podStartup: o.podStartup, kwok: o.kwok, scheduler: o.scheduler,
		podsPerNode: o.podsPerNode, apiInflight: o.apiInflight, schedulerQPS: o.schedulerQPS})
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	defer func() {
		if !o.keep {
			c.stop()
			_ = os.RemoveAll(c.dir)
		} else {
			c.stop()
			fmt.Fprintln(os.Stderr, "scale: logs kept in", c.dir)
		}
	}()
	fmt.Fprintf(os.Stderr, "scale: control plane, kube-scheduler, kwok and %d nodes up in %s\n", o.nodes, time.Since(started).Round(time.Millisecond))
	fw, err := watchFleet(ctx, c, sandboxpod.AgentPort)
	if err != nil {
		return nil, err
	}
	defer fw.stop()
	bin, err := o.managerBin, error(nil)
	if bin == "" {
		bin, err = buildManager(c.dir)
	}
	if err != nil {
		return nil, err
	}
	e := &env{o: o, cluster: c, fleet: fw, binary: bin, dir: c.dir}
	var rep *report
	switch o.scenario {
	case "claims":
		rep, err = claims(ctx, e)
	case "fill":
		rep, err = fill(ctx, e)
	case "executions":
		rep, err = executions(ctx, e)
	case "failover":
		rep, err = failover(ctx, e)
	case "nodeloss":
		rep, err = nodeloss(ctx, e)
	default:
		return nil, fmt.Errorf("no scenario %q: claims, fill, executions, failover or nodeloss", o.scenario)
	}
	if rep != nil {
		rep.Simulated = "kwok plays the nodes and the kubelet (a pod is Ready " + o.podStartup.String() +
			" after it is bound); a stand-in fleet answers the agent API at each pod's IP (no Python runs); " +
			"kube-apiserver, etcd, kube-scheduler and the manager are the real binaries, on one 2-core machine"
		rep.FleetRequests = fw.fleet.Requests()
		rep.FleetErrors = fw.fleet.Errors()
	}
	return rep, err
}

// startManager starts a manager named name with the run's settings.
func (e *env) startManager(name string, leaderLock bool) (*manager, error) {
	return startManager(managerOptions{binary: e.binary, kubeconfig: e.cluster.kubeconfig, dir: e.dir, name: name,
		agentPort: sandboxpod.AgentPort, leaderLock: leaderLock, qps: e.o.managerQPS, burst: e.o.managerBurst,
		extraArgs: strings.Fields(e.o.managerArgs)})
}

// managerAndClient starts the scenario's manager (the caller stops it) and
// returns it with the load's client.
func (e *env) managerAndClient() (*manager, client.Client, *rest.Config, error) {
	m, err := e.startManager("manager", true)
	if err != nil {
		return nil, nil, nil, err
	}
	c, cfg, err := e.client()
	if err != nil {
		m.stop(10 * time.Second)
		return nil, nil, nil, err
	}
	return m, c, cfg, nil
}

// profiles saves the manager's heap and a CPU profile of secs, when asked.
func (e *env) profiles(ctx context.Context, m *manager, tag string, secs int) {
	if e.o.pprofDir == "" {
		return
	}
	_ = os.MkdirAll(e.o.pprofDir, 0o755)
	_ = m.profile(ctx, "heap", filepath.Join(e.o.pprofDir, e.o.scenario+"-"+tag+"-heap.pb.gz"), 0)
	if secs > 0 {
		// kube-apiserver's too, at the same time: on one machine it is what the load costs most.
		go func() {
			data, err := e.cluster.cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", strconv.Itoa(secs)).DoRaw(ctx)
			if err == nil {
				_ = os.WriteFile(filepath.Join(e.o.pprofDir, e.o.scenario+"-"+tag+"-kube-apiserver-cpu.pb.gz"), data, 0o600)
			}
		}()
		_ = m.profile(ctx, "profile", filepath.Join(e.o.pprofDir, e.o.scenario+"-"+tag+"-cpu.pb.gz"), secs)
	}
}
