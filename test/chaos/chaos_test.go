// Package chaos runs many Executions of mixed kinds against two manager
// processes under leader election while it injects faults at random
// (seeded, reported): SIGKILL of the leading manager, SIGKILL of sandbox
// agents and interpreters, sandbox pods deleted mid-run, the kube-apiserver
// killed and restarted. It then checks what a user relies on: every Execution
// ends; no code ran twice; every Succeeded result is the one its code
// computes; no session saw another's state; no pod is leaked or left
// claimed; no Execution waited long while an idle pod was free.
//
// The control plane is envtest's; the pods are run by the local kubelet
// (internal/testing/localkubelet) as real agents with real python3, each on
// an address of its own, so the managers reach them as they reach pod IPs.
//
// CHAOS_EXECUTIONS, CHAOS_SEED (default 1) and CHAOS_FAULT_SECONDS (the least
// time faults go on, default 60) size and seed a run; without
// CHAOS_EXECUTIONS the test is skipped. `make test-chaos` runs 200 (CI does),
// docs/reliability.md has a long run.
package chaos

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

const (
	ns        = "chaos"
	managerNS = "warmpool-system"
	leaseName = "manager.warmpool.dev"
	// idleBound is the longest an Execution may wait for a fresh pod while its
	// pool has an idle one and a manager leads: a new leader syncs its caches
	// first, and after an API server restart both managers may have lost their lease.
	idleBound   = 30 * time.Second
	settleLimit = 5 * time.Minute // all Executions end within this after the faults stop
	// minLeaderKills: a run of 200 or more that killed fewer leaders did not test failover.
	minLeaderKills = 3
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func TestChaos(t *testing.T) {
	total, seed := envInt("CHAOS_EXECUTIONS", 0), int64(envInt("CHAOS_SEED", 1))
	faultPhase := time.Duration(envInt("CHAOS_FAULT_SECONDS", 60)) * time.Second
	if total == 0 {
		t.Skip("set CHAOS_EXECUTIONS (make test-chaos): the chaos suite takes minutes")
	}
	logf.SetLogger(logr.Discard()) // the kubelet stand-in's errors while the API server is down are expected
	h := newHarness(t, seed)
	t.Logf("chaos: %d executions, seed %d, faults for at least %s", total, seed, faultPhase)

	h.createPools()
	stopFaults, stopWatch := make(chan struct{}), make(chan struct{})
	var wg, suspending sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); h.injectFaults(stopFaults) }()
	go func() { defer wg.Done(); h.watchIdleWaits(stopWatch) }()
	start := time.Now()
	for i := range max(3, total/50) {
		suspending.Add(1)
		go func() { defer suspending.Done(); h.suspendingSession(i, 4) }()
	}
	h.submit(total)
	// Faults go on for at least faultPhase, then everything must end within settleLimit.
	if left := time.Until(start.Add(faultPhase)); left > 0 {
		time.Sleep(left)
	}
	// A short run can draw few leader kills (the picker skips while no leader
	// is elected): go on until failover was tested, for at most 90 s more.
	for extra := time.Now().Add(90 * time.Second); total >= 200 && h.faultCount("kill-leader") < minLeaderKills && time.Now().Before(extra); {
		time.Sleep(time.Second)
	}
	suspending.Wait()
	close(stopFaults)
	faultsEnded := time.Now()
	h.waitAllFinished(faultsEnded.Add(settleLimit))
	close(stopWatch)
	wg.Wait()
	elapsed := time.Since(start)
	h.settle()
	r := h.check()
	r.elapsed, r.seed = elapsed, seed
	t.Log("\n" + r.String())
	if dir := os.Getenv("CHAOS_KEEP_LOGS"); dir != "" {
		// The managers' logs outlive the run's temporary directory.
		_ = os.MkdirAll(dir, 0o755)
		for i := 0; i < 2; i++ {
			name := fmt.Sprintf("manager-%d.log", i)
			if data, err := os.ReadFile(filepath.Join(h.dir, name)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name), data, 0o644)
			}
		}
	}
	if r.lost+r.doubleRuns+r.wrong+r.isolation+r.leaked+r.idleViolations+r.snapshotLost > 0 {
		t.Fatalf("invariants broken: %s", r.summary())
	}
	if f := h.faultCount("kill-leader"); total >= 200 && f < minLeaderKills {
		t.Fatalf("only %d leader kills: the run did not test failover", f)
	}
	if r.resumes == 0 {
		t.Fatalf("no Session was resumed: the run did not test suspend and resume")
	}
	if h.previousBin != "" && total >= 200 && h.faultCount("upgrade-manager") == 0 {
		t.Fatalf("no manager was upgraded or rolled back: the run did not test mixed builds")
	}
}

// harness owns the control plane, the kubelet, the managers and the workload.
type harness struct {
	t          *testing.T
	env        *testenv.Env
	k8s        client.Client
	kubelet    *localkubelet.Kubelet
	agentPort  int
	managerBin string
	// previousBin is the previous release's manager (CHAOS_PREVIOUS_MANAGER,
	// make test-chaos builds it): the upgrade-manager fault swaps a manager
	// between the two builds, as a rolling upgrade (or a rollback) does.
	previousBin string
	// builds is the binary each manager runs next (managerBin unless swapped).
	builds     map[int]string
	kubeconfig string
	dir        string
	runLog     string
	rng        *rand.Rand
	// store keeps the suspended Sessions' snapshots (a real S3 server).
	store *objectstore.Server

	mu       sync.Mutex
	managers []*managerProc
	faults   map[string]int
	expected map[string]expectation
	apiPID   int
	proxy    *lagProxy
	// stopping ends the restarts of managers that exit.
	stopping chan struct{}
	// lastLeaderKill is only used by the fault goroutine.
	lastLeaderKill time.Time
	// idleWaitMax is the longest wait for a fresh pod seen while the pool had an idle one.
	idleWaitMax    time.Duration
	idleViolations []string
}

type managerProc struct {
	cmd         *exec.Cmd
	metricsAddr string
	done        chan struct{}
	bin         string
}

func newHarness(t *testing.T, seed int64) *harness {
	h := &harness{t: t, rng: rand.New(rand.NewSource(seed)), faults: map[string]int{}, expected: map[string]expectation{},
		stopping: make(chan struct{}), builds: map[int]string{}, previousBin: os.Getenv("CHAOS_PREVIOUS_MANAGER")}
	h.dir = t.TempDir()
	h.runLog = filepath.Join(h.dir, "runs.log")
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.killAPIServerCopy()
		_ = env.Stop()
	})
	h.env, h.k8s = env, env.Client

	// The managers' credentials, used by the proxy: an admin user of envtest's API server.
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "chaos-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The managers reach the API server through a proxy that can make their pod cache lag.
	h.proxy = newLagProxy(t, user.Config())
	h.kubeconfig = filepath.Join(h.dir, "kubeconfig")
	must(t, os.WriteFile(h.kubeconfig, h.proxy.kubeconfig(), 0o600))

	h.managerBin = filepath.Join(h.dir, "manager")
	agent := filepath.Join(h.dir, "agent")
	for bin, pkg := range map[string]string{h.managerBin: "./cmd/manager", agent: "./cmd/agent"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Dir = testenv.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}

	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "runtimeclass", "runtimeclass.yaml"))
	must(t, err)
	rc := &nodev1.RuntimeClass{}
	must(t, yaml.Unmarshal(data, rc))
	ctx := context.Background()
	must(t, h.k8s.Create(ctx, rc))
	for _, name := range []string{ns, managerNS} {
		must(t, h.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	}

	// The snapshot store of the suspending Sessions: SeaweedFS, outliving the managers.
	h.store, err = objectstore.Start()
	must(t, err)
	t.Cleanup(h.store.Stop)

	// The kubelet stand-in, in this process: pods outlive the managers.
	h.agentPort = freePort(t)
	kmgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	must(t, err)
	h.kubelet = &localkubelet.Kubelet{Client: kmgr.GetClient(), AgentBinary: agent, Dir: filepath.Join(h.dir, "pods"),
		AgentPort: h.agentPort, Log: ctrl.Log.WithName("kubelet")}
	must(t, h.kubelet.SetupWithManager(kmgr))
	kctx, kcancel := context.WithCancel(context.Background())
	go func() { _ = kmgr.Start(kctx) }()
	t.Cleanup(func() { kcancel(); h.kubelet.StopAll() })

	for i := 0; i < 2; i++ {
		h.startManager(i)
	}
	t.Cleanup(func() {
		close(h.stopping)
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.managers {
			if m != nil {
				_ = m.cmd.Process.Kill()
				<-m.done
			}
		}
	})
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startManager starts manager process i (cmd/manager, as deployed, with a
// short lease so failovers take seconds).
func (h *harness) startManager(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.managers) <= i {
		h.managers = append(h.managers, nil)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(h.t))
	logFile, err := os.OpenFile(filepath.Join(h.dir, fmt.Sprintf("manager-%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(h.t, err)
	bin := h.managerBin
	if b := h.builds[i]; b != "" {
		bin = b
	}
	cmd := exec.Command(bin, "--kubeconfig", h.kubeconfig, "--leader-elect", "--leader-election-namespace", managerNS,
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
		"--manager-namespace", managerNS, "--agent-port", strconv.Itoa(h.agentPort),
		"--metrics-bind-address", metrics, "--metrics-secure=false", "--health-probe-bind-address", "0",
		"--snapshot-store-endpoint", h.store.Endpoint, "--snapshot-store-insecure", "--snapshot-store-bucket", "chaos-snapshots")
	if v := os.Getenv("CHAOS_MANAGER_VERBOSITY"); v != "" {
		// With CHAOS_KEEP_LOGS: what the managers decided, for a failed run.
		cmd.Args = append(cmd.Args, "--zap-log-level="+v)
	}
	cmd.Env = append(os.Environ(), "WARMPOOL_SNAPSHOT_STORE_ACCESS_KEY_ID="+objectstore.AccessKeyID,
		"WARMPOOL_SNAPSHOT_STORE_SECRET_ACCESS_KEY="+objectstore.SecretAccessKey)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(h.t, cmd.Start())
	m := &managerProc{cmd: cmd, metricsAddr: metrics, done: make(chan struct{}), bin: bin}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(m.done)
		// Like a Deployment's kubelet: a manager that exits (killed, or it lost
		// its lease while the API server was away) is started again.
		select {
		case <-h.stopping:
		case <-time.After(time.Second):
			h.startManager(i)
		}
	}()
	h.managers[i] = m
}

// leader returns the index of the manager that leads, or -1.
func (h *harness) leader() int {
	h.mu.Lock()
	managers := append([]*managerProc{}, h.managers...)
	h.mu.Unlock()
	c := http.Client{Timeout: time.Second}
	for i, m := range managers {
		resp, err := c.Get("http://" + m.metricsAddr + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "leader_election_master_status") && strings.HasSuffix(l, " 1") {
				resp.Body.Close()
				return i
			}
		}
		resp.Body.Close()
	}
	return -1
}

func (h *harness) count(fault string) {
	h.mu.Lock()
	h.faults[fault]++
	h.mu.Unlock()
}

func (h *harness) faultCount(fault string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.faults[fault]
}

func (h *harness) createPools() {
	ctx := context.Background()
	pools := []*sandboxv1alpha1.SandboxPool{
		wrappers.Pool(ns, "plain").Replicas(4).GracePeriod(time.Second).Obj(),
		wrappers.Pool(ns, "fresh").Replicas(2).GracePeriod(time.Second).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj(),
		wrappers.Pool(ns, "sessions").Replicas(2).GracePeriod(time.Second).SessionIdleTimeout(20 * time.Second).Obj(),
		wrappers.Pool(ns, "suspending").Replicas(2).GracePeriod(time.Second).SessionIdleTimeout(5 * time.Minute).
			SessionSuspendAfter(time.Second).Obj(),
	}
	for _, p := range pools {
		must(h.t, h.k8s.Create(ctx, p))
	}
}
