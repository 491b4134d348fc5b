// Package localkubelet plays the kubelet for sandbox pods in envtest, which has
// no kubelet: for each sandbox pod it starts the real agent binary (with a real
// python3) as a local process on a free loopback port, marks the pod Running
// and Ready, and stops the process when the pod is deleted. It also resolves
// pods to their agents' addresses for the manager (agentgate.Resolver), so the
// manager has no test-only code paths.
package localkubelet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// AnnotationImagePullBackOff on a pod makes the kubelet report ImagePullBackOff instead of starting it.
const AnnotationImagePullBackOff = "localkubelet.warmpool.dev/image-pull-backoff"

// AnnotationUnschedulable on a pod makes the kubelet play a scheduler that
// finds no node for it: PodScheduled False, reason Unschedulable, with the
// annotation's value as the scheduler's message.
const AnnotationUnschedulable = "localkubelet.warmpool.dev/unschedulable"

// Kubelet runs sandbox pods as local agent processes.
type Kubelet struct {
	client.Client
	// AgentBinary is the path of the built cmd/agent.
	AgentBinary string
	// Dir holds the pods' workspaces and token files.
	Dir string
	// Python is the interpreter the agents run; empty means the agent's default (python3).
	Python string
	Log    logr.Logger

	mu    sync.Mutex
	procs map[types.NamespacedName]*proc
	// Started counts agent processes started.
	started int

	// AgentPort, when set, gives every pod an address of its own on the
	// loopback network (127.1.0.1, 127.1.0.2...) with the agents all on this
	// port, as pod IPs on a cluster: a manager in another process then reaches
	// them with agentgate.PodIPResolver{Port: AgentPort}. Unset: 127.0.0.1 and a
	// free port per agent, reachable through Address only.
	AgentPort int
	nextIP    uint32

	// StartDelay stands for image pulls and sandbox boots: a pod's agent
	// starts this long after the kubelet first saw the pod (so a pod becomes
	// Ready about StartDelay after its creation). Waiting pods hold no worker.
	StartDelay time.Duration
	firstSeen  map[types.NamespacedName]seen

	// ended holds, by pod, the Failed status of a pod whose agent exited:
	// its restart policy is Never, so the agent is never started again, and
	// the status is written again until it is stored (the API server may be
	// away when the agent exits). A kubelet that started a new agent there
	// would hand the manager an agent that never heard of the pod's run.
	ended map[types.NamespacedName]endedAgent
	// notRestarted counts the times a pod whose agent had exited was seen
	// not yet Failed (where a new agent used to be started).
	notRestarted int
}

type endedAgent struct {
	uid    types.UID
	status func(*corev1.PodStatus)
}

// seen is when the kubelet first saw a pod (of that UID).
type seen struct {
	uid types.UID
	at  time.Time
}

type proc struct {
	uid      types.UID
	cmd      *exec.Cmd
	addr     string
	stopping bool
	exited   chan struct{}
	// terminationLog is where the agent writes why it gave up.
	terminationLog string
	// ready: the agent answered its readiness probe; ip is the pod's address.
	// A pod is reported Running and Ready only once ready is set.
	ready bool
	ip    string
	// cutOff, when set, is the address the manager is given instead of
	// addr: one where nothing listens (CutOff).
	cutOff string
	// endReason, set before a kill, is the reason the container status gives
	// ("OOMKilled"), as the kubelet reports a container the kernel killed.
	endReason string
}

// Address implements agentgate.Resolver.
func (k *Kubelet) Address(pod *corev1.Pod) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.procs[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}]
	if !ok || p.uid != pod.UID {
		return "", fmt.Errorf("no agent runs for pod %s", pod.Name)
	}
	if p.cutOff != "" {
		return p.cutOff, nil
	}
	return p.addr, nil
}

// CutOff makes a pod's agent unreachable for the manager, as a pod on a node
// that went away: its address then refuses every connection, so nothing the
// manager sends reaches the agent (which runs on, and keeps the pod Ready).
func (k *Kubelet) CutOff(namespace, name string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	refused := "http://" + l.Addr().String()
	_ = l.Close()
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.procs[types.NamespacedName{Namespace: namespace, Name: name}]
	if !ok {
		return fmt.Errorf("no agent runs for pod %s/%s", namespace, name)
	}
	p.cutOff = refused
	return nil
}

// KillAgent kills the agent of a pod with SIGKILL, as a crashing container:
// the pod is marked Failed. It reports whether an agent ran.
func (k *Kubelet) KillAgent(namespace, name string) bool {
	k.mu.Lock()
	p, ok := k.procs[types.NamespacedName{Namespace: namespace, Name: name}]
	k.mu.Unlock()
	return ok && p.cmd.Process.Kill() == nil
}

// OOMKill kills the agent of a pod as the kernel does a container past its
// memory limit: SIGKILL, and the container ends with reason OOMKilled.
func (k *Kubelet) OOMKill(namespace, name string) bool {
	k.mu.Lock()
	p, ok := k.procs[types.NamespacedName{Namespace: namespace, Name: name}]
	if ok {
		p.endReason = "OOMKilled"
	}
	k.mu.Unlock()
	return ok && p.cmd.Process.Kill() == nil
}

// FreezeAgent stops a pod's agent and its interpreters with SIGSTOP, as a
// hung container: the process lives and answers nothing. Thaw resumes them.
func (k *Kubelet) FreezeAgent(namespace, name string) (thaw func(), ok bool) {
	k.mu.Lock()
	p, ok := k.procs[types.NamespacedName{Namespace: namespace, Name: name}]
	k.mu.Unlock()
	if !ok {
		return func() {}, false
	}
	pids := append([]int{p.cmd.Process.Pid}, ChildPIDs(p.cmd.Process.Pid)...)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	return func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}, true
}

// KillInterpreters SIGKILLs the child processes of a pod's agent (its
// interpreters, and anything else it started) and returns how many.
func (k *Kubelet) KillInterpreters(namespace, name string) int {
	k.mu.Lock()
	p, ok := k.procs[types.NamespacedName{Namespace: namespace, Name: name}]
	k.mu.Unlock()
	if !ok {
		return 0
	}
	n := 0
	for _, pid := range ChildPIDs(p.cmd.Process.Pid) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// ChildPIDs lists the processes whose parent is pid (from /proc).
func ChildPIDs(pid int) []int {
	parent := strconv.Itoa(pid)
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 1 && f[1] == parent {
			out = append(out, child)
		}
	}
	return out
}

// Started returns how many agent processes were started.
func (k *Kubelet) Started() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.started
}

// NotRestarted counts the times the kubelet found a pod whose agent had
// exited not yet marked Failed (its status write had failed), and did not
// start another agent there.
func (k *Kubelet) NotRestarted() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.notRestarted
}

// SetupWithManager registers the kubelet as a controller of sandbox pods.
func (k *Kubelet) SetupWithManager(mgr ctrl.Manager) error {
	k.procs = map[types.NamespacedName]*proc{}
	k.firstSeen = map[types.NamespacedName]seen{}
	k.ended = map[types.NamespacedName]endedAgent{}
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Pod{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Named("localkubelet").
		Complete(k)
}

// Reconcile starts or stops the agent of one pod.
func (k *Kubelet) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	err := k.Get(ctx, req.NamespacedName, pod)
	if apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil) {
		k.stop(req.NamespacedName)
		k.mu.Lock()
		delete(k.firstSeen, req.NamespacedName)
		delete(k.ended, req.NamespacedName)
		k.mu.Unlock()
		return ctrl.Result{}, nil
	}
	if err != nil || pod.Labels[sandboxpod.LabelPool] == "" {
		return ctrl.Result{}, err
	}
	k.mu.Lock()
	p, running := k.procs[req.NamespacedName]
	end, hasEnded := k.ended[req.NamespacedName]
	k.mu.Unlock()
	if hasEnded && end.uid == pod.UID {
		// Its agent exited (RestartPolicy Never): say so until it is stored.
		if pod.Status.Phase == corev1.PodFailed {
			return ctrl.Result{}, nil
		}
		k.mu.Lock()
		k.notRestarted++
		k.mu.Unlock()
		if err := k.setStatus(ctx, pod, end.status); err != nil {
			return ctrl.Result{RequeueAfter: 500 * time.Millisecond}, client.IgnoreNotFound(err)
		}
		return ctrl.Result{}, nil
	}
	if running && p.uid != pod.UID { // a new pod of the same name
		k.stop(req.NamespacedName)
		running = false
	}
	if running {
		k.mu.Lock()
		ready, ip, addr := p.ready, p.ip, p.addr
		k.mu.Unlock()
		if !ready {
			// The start gave up waiting for the agent (a machine busy with
			// other work): go on probing it, as a kubelet does, instead of
			// leaving the pod Pending for good.
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := agentclient.New(addr, "").Ready(pctx)
			cancel()
			if err != nil {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			k.mu.Lock()
			p.ready = true
			k.mu.Unlock()
			ready = true
		}
		// The agent is ready but writing that failed (the API server was away): write it again.
		if ready && pod.Status.Phase == corev1.PodPending {
			return ctrl.Result{}, client.IgnoreNotFound(k.markReady(ctx, pod, ip))
		}
		return ctrl.Result{}, nil
	}
	if pod.Status.Phase == corev1.PodFailed {
		return ctrl.Result{}, nil
	}
	if msg, ok := pod.Annotations[AnnotationUnschedulable]; ok {
		return ctrl.Result{}, k.setStatus(ctx, pod, func(st *corev1.PodStatus) {
			st.Phase = corev1.PodPending
			st.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, Message: msg, LastTransitionTime: metav1.Now()}}
		})
	}
	if _, ok := pod.Annotations[AnnotationImagePullBackOff]; ok {
		return ctrl.Result{}, k.setStatus(ctx, pod, func(st *corev1.PodStatus) {
			st.Phase = corev1.PodPending
			st.ContainerStatuses = []corev1.ContainerStatus{{Name: sandboxpod.ContainerName, Image: pod.Spec.Containers[0].Image,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
					Message: fmt.Sprintf("Back-off pulling image %q", pod.Spec.Containers[0].Image)}}}}
		})
	}
	if wait := k.delay(req.NamespacedName, pod.UID); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	// A pod deleted while its agent started is no error.
	return ctrl.Result{}, client.IgnoreNotFound(k.start(ctx, pod))
}

// delay is how much longer the pod's start is held back by StartDelay.
func (k *Kubelet) delay(key types.NamespacedName, uid types.UID) time.Duration {
	if k.StartDelay <= 0 {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	first, ok := k.firstSeen[key]
	if !ok || first.uid != uid {
		first = seen{uid: uid, at: time.Now()}
		k.firstSeen[key] = first
	}
	wait := k.StartDelay - time.Since(first.at)
	if wait <= 0 { // starting now; a pod deleted before is forgotten on deletion
		delete(k.firstSeen, key)
	}
	return wait
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (k *Kubelet) start(ctx context.Context, pod *corev1.Pod) error {
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	dir := filepath.Join(k.Dir, pod.Namespace, pod.Name)
	if err := os.MkdirAll(filepath.Join(dir, "workspace"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return err
	}
	ip, port := "127.0.0.1", k.AgentPort
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
	} else {
		k.mu.Lock()
		k.nextIP++
		n := k.nextIP
		k.mu.Unlock()
		ip = fmt.Sprintf("127.%d.%d.%d", 1+n/65025, n/255%255, 1+n%255)
	}
	// The container's own args, with the kubelet's local paths and port.
	args := append([]string{}, pod.Spec.Containers[0].Args...)
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--listen":
			args[i+1] = fmt.Sprintf("%s:%d", ip, port)
		case "--workspace":
			args[i+1] = filepath.Join(dir, "workspace")
		case "--scratch-dirs":
			args[i+1] = filepath.Join(dir, "tmp")
		}
	}
	if k.Python != "" {
		args = append(args, "--python", k.Python)
	}
	// The container runtime's /dev/termination-log, per pod.
	terminationLog := filepath.Join(dir, "termination-log")
	args = append(args, "--termination-log", terminationLog)
	cmd := exec.Command(k.AgentBinary, args...)
	// The pod's /tmp, per pod, as its emptyDir would be.
	cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(dir, "tmp"))
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "HOME" || e.Name == "TMPDIR" {
			continue
		}
		v, err := envValue(pod, e)
		if err != nil {
			return err
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	cmd.Stderr = &prefixWriter{log: k.Log.WithValues("pod", pod.Name)}
	// A test process that dies must not leave agents behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent for pod %s: %w", pod.Name, err)
	}
	p := &proc{uid: pod.UID, cmd: cmd, addr: fmt.Sprintf("http://%s:%d", ip, port), ip: ip, exited: make(chan struct{}), terminationLog: terminationLog}
	k.mu.Lock()
	k.procs[key] = p
	k.started++
	k.mu.Unlock()
	go k.watch(key, p)

	c := agentclient.New(p.addr, "") // readiness needs no token
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.exited: // it gave up: watch marks the pod Failed
			cancel()
		case <-rctx.Done():
		}
	}()
	if err := c.WaitReady(rctx); err != nil {
		return fmt.Errorf("agent of pod %s: %w", pod.Name, err)
	}
	k.mu.Lock()
	p.ready = true
	k.mu.Unlock()
	return k.markReady(ctx, pod, ip)
}

// markReady reports a pod whose agent is ready as Running and Ready.
func (k *Kubelet) markReady(ctx context.Context, pod *corev1.Pod, ip string) error {
	now := metav1.Now()
	return k.setStatus(ctx, pod, func(st *corev1.PodStatus) {
		st.Phase = corev1.PodRunning
		st.PodIP, st.HostIP = ip, "127.0.0.1"
		st.PodIPs = []corev1.PodIP{{IP: ip}}
		st.StartTime = &now
		st.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: sandboxpod.ContainerName, Ready: true, Started: ptrTrue(),
			Image: pod.Spec.Containers[0].Image, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	})
}

// watch marks the pod Failed when its agent exits on its own.
func (k *Kubelet) watch(key types.NamespacedName, p *proc) {
	err := p.cmd.Wait()
	close(p.exited)
	k.mu.Lock()
	stopping, endReason := p.stopping, p.endReason
	if k.procs[key] == p {
		delete(k.procs, key)
	}
	k.mu.Unlock()
	if stopping {
		return
	}
	pod := &corev1.Pod{}
	if k.Get(context.Background(), key, pod) != nil || pod.UID != p.uid {
		return
	}
	message, _ := os.ReadFile(p.terminationLog)
	failed := func(st *corev1.PodStatus) {
		st.Phase = corev1.PodFailed
		st.Reason, st.Message = "Error", fmt.Sprintf("the agent exited: %v", err)
		// As the kubelet reports a container that ended (RestartPolicy Never).
		exit, reason := int32(1), "Error"
		if p.cmd.ProcessState != nil {
			exit = int32(p.cmd.ProcessState.ExitCode())
		}
		if endReason != "" {
			st.Reason, st.Message, exit, reason = "", "", 137, endReason
		}
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: sandboxpod.ContainerName, Image: pod.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: reason,
				Message: string(message), FinishedAt: metav1.Now()}}}}
		for i := range st.Conditions {
			if st.Conditions[i].Type == corev1.PodReady || st.Conditions[i].Type == corev1.ContainersReady {
				st.Conditions[i].Status = corev1.ConditionFalse
			}
		}
	}
	k.mu.Lock()
	k.ended[key] = endedAgent{uid: p.uid, status: failed}
	k.mu.Unlock()
	// A failed write (the API server away) is written again by Reconcile,
	// woken by the pod's next event or this retry.
	for range 120 {
		err := k.setStatus(context.Background(), pod, failed)
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(time.Second)
		if k.Get(context.Background(), key, pod) != nil || pod.UID != p.uid || pod.Status.Phase == corev1.PodFailed {
			return
		}
	}
}

func (k *Kubelet) stop(key types.NamespacedName) {
	k.mu.Lock()
	p, ok := k.procs[key]
	if ok {
		p.stopping = true
		delete(k.procs, key)
	}
	k.mu.Unlock()
	if ok {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// StopAll kills every agent.
func (k *Kubelet) StopAll() {
	k.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(k.procs))
	for key := range k.procs {
		keys = append(keys, key)
	}
	k.mu.Unlock()
	for _, key := range keys {
		k.stop(key)
	}
}

func (k *Kubelet) setStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.PodStatus)) error {
	for i := 0; i < 5; i++ {
		mutate(&pod.Status)
		err := k.Status().Update(ctx, pod)
		if !apierrors.IsConflict(err) {
			return err
		}
		if err := k.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
	}
	return fmt.Errorf("update status of pod %s: too many conflicts", pod.Name)
}

// envValue resolves an env var as the kubelet would: a value, or the pod's
// metadata through the downward API (the agent learns its pod UID so).
func envValue(pod *corev1.Pod, e corev1.EnvVar) (string, error) {
	if e.ValueFrom == nil {
		return e.Value, nil
	}
	if f := e.ValueFrom.FieldRef; f != nil {
		switch f.FieldPath {
		case "metadata.uid":
			return string(pod.UID), nil
		case "metadata.name":
			return pod.Name, nil
		case "metadata.namespace":
			return pod.Namespace, nil
		}
	}
	return "", fmt.Errorf("pod %s: env %s: this stand-in kubelet resolves only metadata.uid/name/namespace", pod.Name, e.Name)
}

func ptrTrue() *bool { b := true; return &b }

// prefixWriter sends an agent's log lines to the test log.
type prefixWriter struct{ log logr.Logger }

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.log.V(1).Info(line)
	}
	return len(b), nil
}
