package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// managerNamespace stands for warmpool-system.
const managerNamespace = "warmpool-system"

// manager is the real manager binary (cmd/manager) running as its own
// process, so that its CPU and memory are its own, with its metrics and
// pprof on loopback ports.
type manager struct {
	*process
	metricsURL, pprofURL string
	log                  string
}

type managerOptions struct {
	binary     string
	kubeconfig string
	dir        string
	name       string
	agentPort  int
	leaderLock bool
	qps, burst int
	extraArgs  []string
}

// buildManager builds cmd/manager into dir.
func buildManager(dir string) (string, error) {
	bin := filepath.Join(dir, "manager")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the manager: %w\n%s", err, out)
	}
	return bin, nil
}

func startManager(o managerOptions) (*manager, error) {
	ports := make([]int, 3)
	for i := range ports {
		p, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	args := []string{o.binary,
		"--kubeconfig=" + o.kubeconfig,
		"--mode=controllers",
		"--manager-namespace=" + managerNamespace,
		"--agent-port=" + strconv.Itoa(o.agentPort),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(ports[0]), "--metrics-secure=false",
		"--pprof-bind-address=127.0.0.1:" + strconv.Itoa(ports[1]),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(ports[2]),
		"--zap-log-level=error",
	}
	if o.qps > 0 {
		args = append(args, "--kube-api-qps="+strconv.Itoa(o.qps), "--kube-api-burst="+strconv.Itoa(o.burst))
	}
	if o.leaderLock {
		args = append(args, "--leader-elect", "--leader-election-namespace="+managerNamespace)
	}
	args = append(args, o.extraArgs...)
	log := filepath.Join(o.dir, o.name+".log")
	p, err := start(o.name, log, args...)
	if err != nil {
		return nil, err
	}
	m := &manager{process: p, log: log,
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0]),
		pprofURL:   fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", ports[1])}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := m.scrape(); err == nil {
			return m, nil
		}
		if !m.alive() || time.Now().After(deadline) {
			m.stop(5 * time.Second)
			return nil, fmt.Errorf("the manager did not serve its metrics (log: %s)", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metrics is one scrape: every sample by its name and labels as printed.
type metrics map[string]float64

func (m *manager) scrape() (metrics, error) {
	resp, err := http.Get(m.metricsURL) //nolint:gosec,noctx // loopback, the URL built here
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (metrics, error) {
	out := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// sum adds the samples of a metric whose labels contain every one of match
// (`name{...}` written as name and `key="value"` pairs).
func (ms metrics) sum(name string, match ...string) float64 {
	var t float64
	for k, v := range ms {
		n, labels, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		ok := true
		for _, m := range match {
			if !strings.Contains(labels, m) {
				ok = false
				break
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// quantile estimates a quantile of a histogram between two scrapes, as
// Prometheus' histogram_quantile does (linear within a bucket).
func quantile(q float64, name string, before, after metrics) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for k, v := range after {
		if !strings.HasPrefix(k, name+"_bucket{") {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		leStr := k[i+4:]
		leStr = leStr[:strings.IndexByte(leStr, '"')]
		le, err := strconv.ParseFloat(leStr, 64)
		if err != nil {
			le = 1e308 // +Inf
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].n
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if b.le >= 1e308 {
				return prevLe
			}
			if b.n == prevN {
				return b.le
			}
			return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN)
		}
		prevLe, prevN = b.le, b.n
	}
	return prevLe
}

// usage is the CPU time and memory of a process, from /proc.
type usage struct {
	cpu      time.Duration
	rss, hwm int64 // bytes
}

// procStat reads a process's parent, command name and CPU time from
// /proc/PID/stat.
func procStat(pid int) (ppid int, comm string, cpu time.Duration, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", 0, err
	}
	// The command name is in parentheses and may hold spaces: the fields follow the last ')'.
	open, closing := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || closing < 0 || closing+2 > len(stat) {
		return 0, "", 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(stat[closing+2:]))
	if len(f) < 13 {
		return 0, "", 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, string(stat[open+1 : closing]), time.Duration(utime+stime) * time.Second / 100, nil // USER_HZ
}

func procUsage(pid int) (usage, error) {
	var u usage
	var err error
	if _, _, u.cpu, err = procStat(pid); err != nil {
		return u, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			u.rss = kb << 10
		case "VmHWM":
			u.hwm = kb << 10
		}
	}
	return u, nil
}

// profile saves a pprof profile of the manager (heap, or a CPU profile of secs).
func (m *manager) profile(ctx context.Context, kind, path string, secs int) error {
	u := m.pprofURL + kind
	if kind == "profile" {
		u += "?seconds=" + strconv.Itoa(secs)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(f, resp.Body)
	return err
}

// processCPU is the CPU time of this process and each process started under
// it (kube-apiserver, etcd, kwok, kube-scheduler, the manager), by command name.
func processCPU() map[string]time.Duration {
	self := os.Getpid()
	parent := map[int]int{}
	comm := map[int]string{}
	cpu := map[int]time.Duration{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, name, used, err := procStat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		parent[pid], comm[pid], cpu[pid] = ppid, name, used
	}
	out := map[string]time.Duration{}
	for pid := range cpu {
		for p := pid; p > 1; p = parent[p] {
			if p == self {
				name := comm[pid]
				if pid == self {
					name = "test harness (fleet, load, watches)"
				}
				out[name] += cpu[pid]
				break
			}
		}
	}
	return out
}

// cpuTable is the CPU each process used between two processCPU readings.
func cpuTable(title string, before, after map[string]time.Duration, secs float64) table {
	t := table{Title: title, Header: []string{"process", "CPU (cores, average)"}}
	names := make([]string, 0, len(after))
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var total time.Duration
	for _, n := range names {
		d := after[n] - before[n]
		total += d
		t.Rows = append(t.Rows, []string{n, fmt.Sprintf("%.2f", d.Seconds()/secs)})
	}
	t.Rows = append(t.Rows, []string{"all", fmt.Sprintf("%.2f", total.Seconds()/secs)})
	return t
}
