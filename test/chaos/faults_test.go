package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
)

const leaderKillGap = 8 * time.Second

func keyOf(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

// injectFaults picks a fault every 0.5 to 2.5 s until stop.
func (h *harness) injectFaults(stop <-chan struct{}) {
	faults := []struct {
		name string
		w    int
		do   func() bool
	}{
		{"kill-leader", 20, h.killLeader},
		{"kill-agent", 15, h.killAgent},
		{"kill-interpreter", 20, h.killInterpreter},
		{"delete-pod", 20, h.deleteBusyPod},
		{"restart-apiserver", 5, h.restartAPIServer},
		{"lag-pod-cache", 10, h.lagPodCache},
		// The windows of a suspend and a resume: the leader killed, the pod deleted.
		{"kill-leader-mid-resume", 10, h.killLeaderMidResume},
		{"delete-resuming-pod", 10, h.deleteResumingPod},
		// A rolling upgrade (or rollback) of a manager: SIGTERM, then the
		// other build, which meets the pods, leases and runs of this one.
		{"upgrade-manager", 10, h.upgradeManager},
	}
	total := 0
	for _, f := range faults {
		total += f.w
	}
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(500+h.rng.Intn(2000)) * time.Millisecond):
		}
		x := h.rng.Intn(total)
		for _, f := range faults {
			if x < f.w {
				if f.do() {
					h.count(f.name)
				}
				break
			}
			x -= f.w
		}
	}
}

// killLeader SIGKILLs the manager that leads. At most one kill per
// leaderKillGap: the pool must also work between failovers.
func (h *harness) killLeader() bool {
	if time.Since(h.lastLeaderKill) < leaderKillGap {
		return false
	}
	i := h.leader()
	if i < 0 {
		return false // between leaders already
	}
	h.mu.Lock()
	m := h.managers[i]
	h.mu.Unlock()
	_ = m.cmd.Process.Signal(syscall.SIGKILL) // started again a second later, see startManager
	<-m.done
	h.lastLeaderKill = time.Now()
	return true
}

// upgradeManager stops a manager as a Deployment's rolling update does
// (SIGTERM: its lease released, its data plane drained) and has it started
// again with the other build: the previous release's if it ran this one,
// this one if it ran the previous. Without CHAOS_PREVIOUS_MANAGER, nothing.
func (h *harness) upgradeManager() bool {
	if h.previousBin == "" {
		return false
	}
	i := h.rng.Intn(2)
	h.mu.Lock()
	m := h.managers[i]
	next := h.previousBin
	if m != nil && m.bin == h.previousBin {
		next = h.managerBin
	}
	h.builds[i] = next
	h.mu.Unlock()
	if m == nil {
		return false
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM) // started again a second after it exits, see startManager
	<-m.done
	return true
}

// resuming lists the Sessions between asking to resume and Ready again.
func (h *harness) resuming() []sandboxv1alpha1.Session {
	var list sandboxv1alpha1.SessionList
	if err := h.k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []sandboxv1alpha1.Session
	for _, s := range list.Items {
		if s.Status.Snapshot != nil && (s.ResumeRequested() || s.Status.Phase == sandboxv1alpha1.SessionPending) {
			out = append(out, s)
		}
	}
	return out
}

// awaitResume waits up to 5 s for a Session to be resuming: a resume lasts
// a fraction of a second, and these faults are aimed at it.
func (h *harness) awaitResume() []sandboxv1alpha1.Session {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r := h.resuming(); len(r) > 0 {
			return r
		}
	}
	return nil
}

// killLeaderMidResume kills the leader while a Session resumes.
func (h *harness) killLeaderMidResume() bool {
	return len(h.awaitResume()) > 0 && h.killLeader()
}

// deleteResumingPod deletes the pod a resuming Session has claimed, before
// its Ready status: the resume must go on on another pod.
func (h *harness) deleteResumingPod() bool {
	for _, s := range h.awaitResume() {
		var pods corev1.PodList
		if h.k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelSession: s.Name}) != nil {
			continue
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && h.k8s.Delete(context.Background(), p) == nil {
				return true
			}
		}
	}
	return false
}

// busyPods lists the sandbox pods that run code right now.
func (h *harness) busyPods() []corev1.Pod {
	var list corev1.PodList
	if err := h.k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if lease.ClaimedBy(&p) != "" && !sandboxpod.IsTerminal(&p) {
			out = append(out, p)
		}
	}
	return out
}

func (h *harness) randomBusyPod() *corev1.Pod {
	pods := h.busyPods()
	if len(pods) == 0 {
		return nil
	}
	return &pods[h.rng.Intn(len(pods))]
}

func (h *harness) killAgent() bool {
	p := h.randomBusyPod()
	return p != nil && h.kubelet.KillAgent(p.Namespace, p.Name)
}

// killInterpreter SIGKILLs the interpreter of a busy pod.
func (h *harness) killInterpreter() bool {
	p := h.randomBusyPod()
	return p != nil && h.kubelet.KillInterpreters(p.Namespace, p.Name) > 0
}

// lagPodCache holds back the managers' pod watch streams for a few seconds.
func (h *harness) lagPodCache() bool {
	lag, span := time.Duration(200+h.rng.Intn(800))*time.Millisecond, time.Duration(2+h.rng.Intn(4))*time.Second
	h.proxy.lag.Store(int64(lag))
	time.AfterFunc(span, func() { h.proxy.lag.Store(0) })
	return true
}

func (h *harness) deleteBusyPod() bool {
	p := h.randomBusyPod()
	return p != nil && h.k8s.Delete(context.Background(), p) == nil
}

// restartAPIServer SIGKILLs envtest's kube-apiserver and starts it again with
// the same command line (same port, certificates and etcd): every client's
// watches break and requests fail for a few seconds.
func (h *harness) restartAPIServer() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	pid := h.apiPID
	if pid == 0 {
		for _, child := range localkubelet.ChildPIDs(os.Getpid()) {
			if comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(child), "comm")); strings.TrimSpace(string(comm)) == "kube-apiserver" {
				pid = child
			}
		}
	}
	if pid == 0 {
		return false
	}
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
	time.Sleep(time.Duration(500+h.rng.Intn(2000)) * time.Millisecond) // down for a while
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.t.Errorf("restart kube-apiserver: %v", err)
		return false
	}
	go func() { _ = cmd.Wait() }()
	h.apiPID = cmd.Process.Pid
	// Ready again before the next fault.
	for i := 0; i < 300; i++ {
		if err := h.k8s.Get(context.Background(), keyOf("none"), &corev1.ConfigMap{}); err == nil || apierrors.IsNotFound(err) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// killAPIServerCopy stops the kube-apiserver the harness restarted (envtest
// stops only the one it started).
func (h *harness) killAPIServerCopy() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.apiPID != 0 {
		_ = syscall.Kill(h.apiPID, syscall.SIGTERM)
	}
}
