// Command idlecost measures what an idle warm sandbox costs in CPU on the node
// it runs on, by component, the numbers of docs/performance.md ("The price of
// warm"). Run it as root on the node of a single-node cluster (the local
// cluster: hack/local-cluster.sh) with warmpool deployed and KUBECONFIG set:
//
//	go run ./test/idlecost -pods 20 -runtime gvisor -window 60s
//	go run ./test/idlecost -pods 20 -runtime runc -window 60s
//
// It measures the node with none of its pods first (the baseline), then makes
// a pool of -pods warm sandboxes in a namespace of its own, waits until they
// are idle and Ready and have settled, and reads every host process's CPU
// time from /proc at the start and the end of the window. Processes are put
// in components by the pod cgroup they run in and their place in the process
// tree: gVisor's sentry (runsc-sandbox), the code in the sandbox (systrap's
// stub processes, which run the agent and the interpreter), the gofer, the
// containerd shim with the runsc commands it runs; for runc, the agent and the
// interpreter themselves. Inside gVisor the sentry's own /proc splits the
// code's time between the agent and the interpreter (read with kubectl exec
// at the start and the end). The kubelet's and containerd's share is their
// time with the pods less their time in the baseline.
//
// With -burners N it starves the node during the window (N busy loops, its
// own processes) and reports the warm pods that went from Ready to not Ready
// and the manager's container restarts and leader changes:
//
//	go run ./test/idlecost -pods 40 -cpu-request 10m -burners 4 -window 300s
//
// With -sessions and -executions-per-minute, users work on the starved node
// during the window, on a pool of their own: Sessions run code without pause
// through the data plane, Executions arrive at a steady rate. It reports
// failed or wrong runs, their latency, and Executions that did not end
// right (the starvation test of docs/performance.md):
//
//	go run ./test/idlecost -pods 40 -cpu-request 10m -burners 4 -window 300s -sessions 4 -executions-per-minute 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

func main() {
	pods := flag.Int("pods", 20, "warm sandboxes to measure")
	rt := flag.String("runtime", "gvisor", "gvisor, or runc (the pool without a RuntimeClass)")
	window := flag.Duration("window", 60*time.Second, "how long to measure")
	settle := flag.Duration("settle", 20*time.Second, "wait this long after the pods are idle and Ready")
	image := flag.String("image", "warmpool.dev/repl:dev", "the sandbox image")
	kubectl := flag.String("kubectl", "kubectl", "kubectl, for reading the sandbox's own /proc")
	inside := flag.Int("inside", 3, "pods whose agent and interpreter are read from inside")
	cpuRequest := flag.String("cpu-request", "", "the pool's CPU request (default: the pool's default)")
	burn := flag.Int("burners", 0, "busy loops to run on the node during the window (a starved node), "+
		"counting warm pods that flap and manager restarts")
	nSessions := flag.Int("sessions", 0, "Sessions that run code without pause during the window (with -burners)")
	perMinute := flag.Int("executions-per-minute", 0, "Executions created during the window (with -burners)")
	flag.Parse()
	o := options{cpuRequest: *cpuRequest, burners: *burn, sessions: *nSessions, executionsPerMinute: *perMinute}
	if err := run(*pods, *rt, *window, *settle, *image, *kubectl, *inside, o); err != nil {
		fmt.Fprintln(os.Stderr, "idlecost:", err)
		os.Exit(1)
	}
}

type options struct {
	cpuRequest string
	burners    int
	// sessions and executionsPerMinute: the users' work during the window.
	sessions, executionsPerMinute int
}

func run(n int, rt string, window, settle time.Duration, image, kubectl string, inside int, o options) error {
	ctx := context.Background()
	scheme := clientgoscheme.Scheme
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	fmt.Printf("baseline: the node without the pods, %s\n", window)
	base := measure(window, nil)

	ns := fmt.Sprintf("idlecost-%d", time.Now().Unix())
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	defer func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}()
	runtimeClass := "gvisor"
	if rt == "runc" {
		runtimeClass = ""
	}
	pool := &sandboxv1alpha1.SandboxPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "idle"},
		Spec: sandboxv1alpha1.SandboxPoolSpec{Replicas: int32(n), MaxPods: ptrTo(int32(n)), Image: image, RuntimeClassName: &runtimeClass}}
	if o.cpuRequest != "" {
		q, err := resource.ParseQuantity(o.cpuRequest)
		if err != nil {
			return fmt.Errorf("-cpu-request: %w", err)
		}
		pool.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q}
	}
	if err := c.Create(ctx, pool); err != nil {
		return err
	}
	start := time.Now()
	var uids map[string]string
	for {
		uids, err = readyIdle(ctx, c, ns)
		if err != nil {
			return err
		}
		if len(uids) >= n {
			break
		}
		if time.Since(start) > 15*time.Minute {
			return fmt.Errorf("only %d of %d pods idle and Ready after 15 minutes", len(uids), n)
		}
		time.Sleep(2 * time.Second)
	}
	fmt.Printf("%d %s pods idle and Ready in %s; settling %s, then measuring %s\n", n, rt, time.Since(start).Round(time.Second), settle, window)
	time.Sleep(settle)

	names := make([]string, 0, len(uids))
	for name := range uids {
		names = append(names, name)
	}
	sort.Strings(names)
	if inside > len(names) {
		inside = len(names)
	}
	var wk *work
	if o.sessions > 0 || o.executionsPerMinute > 0 {
		wk, err = startWork(ctx, c, cfg, image, runtimeClass, o.sessions, o.executionsPerMinute)
		if wk != nil {
			defer wk.cleanup()
		}
		if err != nil {
			return err
		}
		fmt.Printf("%d Sessions Ready on a pool of their own; Executions every %s\n", len(wk.sessions), wk.every)
	}
	before := insideTimes(kubectl, ns, names[:inside])
	var wd *watchdog
	if o.burners > 0 {
		stop, err := burners(o.burners)
		if err != nil {
			return err
		}
		defer stop()
		wd = &watchdog{c: c, ns: ns, flaps: map[string]int{}}
		wd.before = wd.manager(ctx)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go wd.run(wctx)
		fmt.Printf("%d busy loops on the node during the window\n", o.burners)
	}
	if wk != nil {
		wk.run(ctx)
	}
	m := measure(window, uids)
	if wd != nil {
		wd.report(ctx)
	}
	if wk != nil {
		wk.end(ctx, 3*time.Minute)
	}
	after := insideTimes(kubectl, ns, names[:inside])
	if got, _ := readyIdle(ctx, c, ns); len(got) < n {
		fmt.Printf("warning: %d of %d pods were idle and Ready at the end (flapping?)\n", len(got), n)
	}
	report(rt, n, window, base, m, splitInside(before, after))
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// readyIdle returns the pool's idle Ready pods, name to UID.
func readyIdle(ctx context.Context, c client.Client, ns string) (map[string]string, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if sandboxpod.IsReady(p) && p.Labels[sandboxpod.LabelState] == sandboxpod.StateIdle {
			out[p.Name] = string(p.UID)
		}
	}
	return out, nil
}

// measurement is CPU seconds by component over a window, and the node's busy share.
type measurement struct {
	seconds map[string]float64
	// byComm is every process's CPU seconds by command name, ours included.
	byComm   map[string]float64
	busy     float64 // share of all CPUs busy
	irq      float64 // share of all CPUs in interrupts
	cpus     int
	duration time.Duration
}

// Components.
const (
	cSentry    = "gVisor sentry (runsc-sandbox)"
	cStubs     = "code in the sandbox: agent and interpreter (systrap stubs)"
	cGofer     = "gVisor gofer"
	cShim      = "containerd shim and the runsc commands it runs"
	cAgent     = "agent"
	cPython    = "interpreter"
	cPause     = "pause"
	cOtherPod  = "other processes of the pods"
	cKubelet   = "kubelet"
	cContainer = "containerd"
)

// measure reads every process before and after the window and adds up the
// CPU each component used; uids (pod UID set by name) selects the pods.
func measure(window time.Duration, uids map[string]string) measurement {
	ours := map[string]bool{}
	for _, u := range uids {
		ours[u] = true
	}
	b0, t0, i0 := nodeBusy()
	s0 := snapshot()
	time.Sleep(window)
	s1 := snapshot()
	b1, t1, i1 := nodeBusy()
	m := measurement{seconds: map[string]float64{}, byComm: map[string]float64{}, duration: window, cpus: cpuCount()}
	if t1 > t0 {
		m.busy = float64(b1-b0) / float64(t1-t0)
		m.irq = float64(i1-i0) / float64(t1-t0)
	}
	kids := map[int][]int{}
	for pid, p := range s1 {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	var inPods func(pid int) bool
	inPods = func(pid int) bool {
		if ours[s1[pid].pod] {
			return true
		}
		for _, k := range kids[pid] {
			if inPods(k) {
				return true
			}
		}
		return false
	}
	underSentry := func(p *proc) bool {
		for q := s1[p.ppid]; q != nil; q = s1[q.ppid] {
			if q.argv0 == "runsc-sandbox" {
				return true
			}
			if q.pid == q.ppid || q.ppid == 0 {
				break
			}
		}
		return false
	}
	delta := func(p *proc, withChildren bool) float64 {
		now, was := p.ticks, uint64(0)
		if withChildren {
			now += p.children
		}
		if old := s0[p.pid]; old != nil && old.comm == p.comm {
			was = old.ticks
			if withChildren {
				was += old.children
			}
		}
		if now < was {
			return 0
		}
		return float64(now-was) / clockTicks
	}
	for _, p := range s1 {
		m.byComm[p.comm] += delta(p, false)
		switch {
		case p.comm == "kubelet":
			m.seconds[cKubelet] += delta(p, false)
		case p.comm == "containerd":
			m.seconds[cContainer] += delta(p, false)
		case len(ours) == 0:
		case strings.HasPrefix(p.comm, "containerd-shim") && inPods(p.pid):
			m.seconds[cShim] += delta(p, true)
		case p.argv0 == "runsc-sandbox" && ours[p.pod]:
			m.seconds[cSentry] += delta(p, false)
		case p.argv0 == "runsc-gofer" && ours[p.pod]:
			m.seconds[cGofer] += delta(p, false)
		case ours[p.pod] && underSentry(p):
			m.seconds[cStubs] += delta(p, false)
		case ours[p.pod] && p.comm == "agent":
			m.seconds[cAgent] += delta(p, false)
		case ours[p.pod] && strings.HasPrefix(p.comm, "python"):
			m.seconds[cPython] += delta(p, false)
		case ours[p.pod] && p.comm == "pause":
			m.seconds[cPause] += delta(p, false)
		case ours[p.pod]:
			m.seconds[cOtherPod] += delta(p, false)
		case p.comm == "runsc" && s1[p.ppid] != nil && strings.HasPrefix(s1[p.ppid].comm, "containerd-shim") && inPods(p.ppid):
			m.seconds[cShim] += delta(p, false)
		}
	}
	return m
}

func cpuCount() int {
	data, _ := os.ReadFile("/proc/stat")
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "cpu") && !strings.HasPrefix(l, "cpu ") {
			n++
		}
	}
	return n
}

// insideScript prints, from the sandbox's own /proc, each process's comm and
// CPU ticks, and its own PID last (to leave it out).
const insideScript = `import os
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            s = open('/proc/%s/stat' % p).read()
            f = s[s.rindex(')') + 2:].split()
            print(p, s[s.index('(') + 1:s.rindex(')')].replace(' ', '_'), int(f[11]) + int(f[12]))
        except Exception:
            pass
print('self', os.getpid(), 0)
`

// insideRead is what insideTimes read in one pod, and when.
type insideRead struct {
	at    time.Time
	procs map[string][2]string // pid -> (comm, ticks)
}

// insideTimes reads the processes of each pod from inside it.
func insideTimes(kubectl, ns string, pods []string) map[string]insideRead {
	out := map[string]insideRead{}
	for _, pod := range pods {
		cmd := exec.Command(kubectl, "exec", "-n", ns, pod, "--", "python3", "-c", insideScript)
		data, err := cmd.Output()
		if err != nil {
			fmt.Printf("warning: read the processes of %s from inside: %v\n", pod, err)
			continue
		}
		procs := map[string][2]string{}
		self := ""
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(l)
			if len(f) != 3 {
				continue
			}
			if f[0] == "self" {
				self = f[1]
				continue
			}
			procs[f[0]] = [2]string{f[1], f[2]}
		}
		delete(procs, self)
		out[pod] = insideRead{at: time.Now(), procs: procs}
	}
	return out
}

// splitInside is the share of one core (%) each process name inside the
// sandboxes used between the two reads of its pod, averaged over the pods
// read both times (an exec that failed leaves its pod out).
func splitInside(before, after map[string]insideRead) map[string]float64 {
	out := map[string]float64{}
	pods := 0
	for pod, a := range after {
		b, ok := before[pod]
		if !ok || !a.at.After(b.at) {
			continue
		}
		pods++
		for pid, p := range a.procs {
			old, ok := b.procs[pid]
			if !ok || old[0] != p[0] {
				continue // the other exec, or a process that came and went
			}
			now, _ := strconv.ParseFloat(p[1], 64)
			was, _ := strconv.ParseFloat(old[1], 64)
			out[p[0]] += (now - was) / clockTicks / a.at.Sub(b.at).Seconds() * 100
		}
	}
	for k := range out {
		out[k] /= float64(pods)
	}
	return out
}

// report prints the per-pod table: share of one core per idle sandbox.
func report(rt string, n int, window time.Duration, base, m measurement, inside map[string]float64) {
	perPod := func(s float64) float64 { return s / window.Seconds() / float64(n) * 100 }
	fmt.Printf("\n%d idle %s sandboxes, %s window, %d CPUs\n\n", n, rt, window, m.cpus)
	fmt.Println("| component | % of one core per idle sandbox |")
	fmt.Println("| --- | ---: |")
	order := []string{cSentry, cStubs, cGofer, cAgent, cPython, cPause, cOtherPod, cShim}
	total := 0.0
	for _, k := range order {
		if s, ok := m.seconds[k]; ok {
			fmt.Printf("| %s | %.2f |\n", k, perPod(s))
			total += perPod(s)
		}
	}
	for _, k := range []string{cKubelet, cContainer} {
		extra := m.seconds[k] - base.seconds[k]*m.duration.Seconds()/base.duration.Seconds()
		fmt.Printf("| %s, above its baseline | %.2f |\n", k, perPod(extra))
		total += perPod(extra)
	}
	fmt.Printf("| **total** | **%.2f** |\n", total)
	nodeExtra := (m.busy - base.busy) * float64(m.cpus) * 100 / float64(n)
	fmt.Printf("| node busy above its baseline, per sandbox (all processes) | %.2f |\n", nodeExtra)
	fmt.Printf("\nnode busy: baseline %.1f%% of %d CPUs, with the pods %.1f%%; interrupts %.1f%% and %.1f%% (%.2f%% of one core per sandbox)\n",
		base.busy*100, m.cpus, m.busy*100, base.irq*100, m.irq*100, (m.irq-base.irq)*float64(m.cpus)*100/float64(n))
	// What else rose with the pods (per sandbox), for the part of the node's
	// time the components above do not explain.
	type rise struct {
		comm string
		pct  float64
	}
	var rises []rise
	for comm, sec := range m.byComm {
		d := perPod(sec - base.byComm[comm]*m.duration.Seconds()/base.duration.Seconds())
		if d >= 0.02 {
			rises = append(rises, rise{comm, d})
		}
	}
	sort.Slice(rises, func(i, j int) bool { return rises[i].pct > rises[j].pct })
	fmt.Println("\nprocesses whose CPU rose with the pods (% of one core per sandbox, by command name):")
	for i, r := range rises {
		if i == 10 {
			break
		}
		fmt.Printf("  %-20s %.2f\n", r.comm, r.pct)
	}
	if len(inside) > 0 {
		fmt.Println("\ninside the sandbox (its own /proc, per pod):")
		names := make([]string, 0, len(inside))
		for k := range inside {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Printf("  %-12s %.3f%% of one core\n", k, inside[k])
		}
	}
}
