package main

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// The stages kwok plays on the simulated pods and nodes: a pod on a node gets
// its IP at once (the fleet's agent listens there from then on, as an agent
// starts inside its container) and turns Ready after the start-up delay; a
// pod being deleted is removed (no kubelet waits for containers to stop); a
// node is Ready with the capacity written here.
//
//go:embed stages.yaml
var stagesYAML string

// kwokNodeAnnotation marks the nodes kwok plays.
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// podCIDR is where kwok takes pod IPs from: loopback, where the fleet can
// listen on each of them.
const podCIDR = "127.16.0.0/12"

// cluster is envtest's kube-apiserver and etcd, kube-scheduler and kwok, and
// the simulated nodes.
type cluster struct {
	env        *testenv.Env
	kubeconfig string // an admin's, for the processes started here
	dir        string
	cs         *kubernetes.Clientset
	procs      []*process
}

type clusterOptions struct {
	nodes        int
	podStartup   time.Duration
	kwok         string
	scheduler    string
	podsPerNode  int
	apiInflight  int
	schedulerQPS int
}

// simulatorNice is the niceness of the processes that stand in for the
// rest of a cluster (kwok's kubelets, the scheduler).
const simulatorNice = "10"

// process is a command started here, stopped by its PID.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func start(name, logPath string, args ...string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); _ = log.Close(); close(p.done) }()
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func startCluster(ctx context.Context, o clusterOptions) (c *cluster, err error) {
	c = &cluster{}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	if c.dir, err = os.MkdirTemp("", "warmpool-scale-"); err != nil {
		return c, err
	}
	// A large cluster's API server admits more requests at once than
	// envtest's defaults (docs/scale.md lists the flags).
	if c.env, err = testenv.StartWith(map[string]string{
		"max-requests-inflight":          strconv.Itoa(o.apiInflight),
		"max-mutating-requests-inflight": strconv.Itoa(o.apiInflight / 2),
	}); err != nil {
		return c, err
	}
	if c.kubeconfig, err = c.env.KubeconfigFor("scale-admin", "system:masters"); err != nil {
		return c, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return c, err
	}
	rc.QPS, rc.Burst = 2000, 4000
	// As kube's own components (and controller-runtime for built-in types):
	// protobuf costs the API server less to encode than JSON.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	if c.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return c, err
	}
	if err := createRuntimeClass(ctx, c.cs); err != nil {
		return c, err
	}
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}}, metav1.CreateOptions{}); err != nil {
		return c, err
	}

	stages := filepath.Join(c.dir, "stages.yaml")
	body := strings.ReplaceAll(stagesYAML, "POD_STARTUP_MILLIS", strconv.FormatInt(o.podStartup.Milliseconds(), 10))
	body = strings.ReplaceAll(body, "PODS_PER_NODE", strconv.Itoa(o.podsPerNode))
	if err := os.WriteFile(stages, []byte(body), 0o600); err != nil {
		return c, err
	}
	// kwok plays the kubelets and the scheduler binds the pool's new pods:
	// in a cluster both run on other machines than the API server and the
	// manager, and neither is on a warm claim's path (they start the pods
	// that refill the pool). On this one machine they yield the CPU to the
	// control plane under test when it is contended (nice 10) instead of
	// taking a sixth of it from the API server in the middle of the claims.
	kwok, err := start("kwok", filepath.Join(c.dir, "kwok.log"), "nice", "-n", simulatorNice, o.kwok, "--kubeconfig="+c.kubeconfig, "--config="+stages,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector="+kwokNodeAnnotation+"=fake",
		"--cidr="+podCIDR, "--node-ip=127.15.0.1", "-v=WARN")
	if err != nil {
		return c, err
	}
	c.procs = append(c.procs, kwok)

	// The real scheduler binds the manager's pods to the simulated nodes,
	// with a client that is not held to client-go's default 50 requests/s.
	schedPort, err := testenv.FreePort()
	if err != nil {
		return c, err
	}
	sched, err := start("kube-scheduler", filepath.Join(c.dir, "kube-scheduler.log"), "nice", "-n", simulatorNice, o.scheduler,
		"--kubeconfig="+c.kubeconfig, "--authentication-kubeconfig="+c.kubeconfig, "--authorization-kubeconfig="+c.kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(schedPort), "--leader-elect=false",
		"--kube-api-qps="+strconv.Itoa(o.schedulerQPS), "--kube-api-burst="+strconv.Itoa(2*o.schedulerQPS), "--v=1")
	if err != nil {
		return c, err
	}
	c.procs = append(c.procs, sched)
	return c, c.addNodes(ctx, o.nodes)
}

// addNodes registers n simulated nodes and waits until kwok has made them Ready.
func (c *cluster) addNodes(ctx context.Context, n int) error {
	if err := parallel(n, func(i int) error {
		name := fmt.Sprintf("kwok-node-%04d", i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{kwokNodeAnnotation: "fake"},
			Labels:      map[string]string{"type": "kwok", corev1.LabelHostname: name}}}
		_, err := c.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create nodes: %w", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.processesAlive(); err != nil {
			return false, err
		}
		nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= n, nil
	}); err != nil {
		return err
	}
	// The API server taints a new node not-ready; the node lifecycle
	// controller (kube-controller-manager, not run here) lifts the taint
	// once the node reports Ready.
	nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, nd := range nodes.Items {
		// kwok writes the node's status meanwhile: a conflict is read again.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			taints := slices.DeleteFunc(slices.Clone(nd.Spec.Taints), func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
			if len(taints) == len(nd.Spec.Taints) {
				return nil
			}
			nd.Spec.Taints = taints
			_, err := c.cs.CoreV1().Nodes().Update(ctx, &nd, metav1.UpdateOptions{})
			if errors.IsConflict(err) {
				if cur, gerr := c.cs.CoreV1().Nodes().Get(ctx, nd.Name, metav1.GetOptions{}); gerr == nil {
					nd = *cur
				}
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("lift the not-ready taint of node %s: %w", nd.Name, err)
		}
	}
	return nil
}

// parallel calls f for 0..n-1, 32 at a time, and returns the first error.
func parallel(n int, f func(i int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// processesAlive fails when kwok or the scheduler exited.
func (c *cluster) processesAlive() error {
	for _, p := range c.procs {
		if !p.alive() {
			return fmt.Errorf("%s exited: %v (its log: %s)", p.name, p.err, filepath.Join(c.dir, p.name+".log"))
		}
	}
	return nil
}

func (c *cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(5 * time.Second)
	}
	if c.env != nil {
		_ = c.env.Stop()
	}
	if c.kubeconfig != "" {
		_ = os.Remove(c.kubeconfig)
	}
}

func createRuntimeClass(ctx context.Context, cs *kubernetes.Clientset) error {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "runtimeclass", "runtimeclass.yaml"))
	if err != nil {
		return err
	}
	rc := &nodev1.RuntimeClass{}
	if err := yaml.Unmarshal(data, rc); err != nil {
		return err
	}
	if _, err := cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the RuntimeClass: %w", err)
	}
	return nil
}
