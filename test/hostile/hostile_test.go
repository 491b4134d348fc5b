package hostile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// The corpus against the real agent binary and a real python3, in both of
// the agent's modes:
//
//   - sandbox: as in a pod, the agent is PID 1 of PID, mount and IPC
//     namespaces of its own (with its own /proc, /dev/shm and /dev/mqueue) and
//     runs as a non-root user with a memory and a process limit. Needs root
//     to make the namespaces; CI runs as root.
//   - daemon: the laptop daemon on a Unix socket, a child of this test.
//
// After each program the agent must be the same process, running (not
// stopped), and back within bounds of memory, threads and descriptors.

const token = "hostile-corpus-token"

// Bounds of what a program may leave the agent holding, over its idle
// baseline (the agent's Go runtime grows a few threads under load).
const (
	rssBound     = 64 << 20
	threadsBound = 16
	fdsBound     = 32
)

func TestCorpus(t *testing.T) {
	corpus, err := Corpus()
	if err != nil {
		t.Fatal(err)
	}
	if len(corpus) < 60 {
		t.Fatalf("the corpus has %d programs; the issue asks for at least 60", len(corpus))
	}
	bin := buildAgent(t)
	for _, mode := range []string{ModeSandbox, ModeDaemon} {
		t.Run(mode, func(t *testing.T) {
			if mode == ModeSandbox && os.Geteuid() != 0 {
				t.Skip("the sandbox mode makes PID, mount and IPC namespaces, which needs root (CI runs as root)")
			}
			a := startAgent(t, bin, mode)
			for _, p := range corpus {
				if !p.RunsIn(mode, a.containment) {
					continue
				}
				t.Run(p.Name, func(t *testing.T) { a.run(t, p) })
			}
		})
	}
}

// agent is one agent under test.
type agent struct {
	mode, containment string
	c                 *client.Client
	pid               int
	workspace         string
	base              usage
	seq               int
}

func buildAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hostile-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "agent")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/agent").CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	return bin
}

// python is the interpreter the agent runs: the one the test scripts chose,
// else Debian's (a non-root agent cannot use a python3 under root's home).
func python() string {
	if p := os.Getenv("WARMPOOL_PYTHON"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, _ := exec.LookPath("python3")
	return p
}

// sandboxUID is the non-root user the sandbox-mode agent runs as.
const sandboxUID = 65534

func startAgent(t *testing.T, bin, mode string) *agent {
	t.Helper()
	root, err := os.MkdirTemp("", "hostile-"+mode+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	ws, scratch := filepath.Join(root, "workspace"), filepath.Join(root, "scratch")
	for _, d := range []string{root, ws, scratch} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if mode == ModeSandbox {
			_ = os.Chown(d, sandboxUID, sandboxUID)
		}
	}
	args := []string{"serve", "--workspace", ws, "--scratch-dirs", scratch, "--python", python(),
		"--memory-limit", strconv.Itoa(512 << 20), "--grace", "1s", "--termination-log", ""}
	var cmd *exec.Cmd
	var c *client.Client
	switch mode {
	case ModeSandbox:
		port := freePort(t)
		args = append(args, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--max-processes", "256")
		// unshare --fork makes the shell PID 1 of the new namespaces, and
		// its exec makes the agent PID 1 (as a container's entrypoint).
		script := `set -e
mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm
mkdir -p /dev/mqueue && mount -t mqueue mqueue /dev/mqueue || true
exec setpriv --reuid=` + strconv.Itoa(sandboxUID) + ` --regid=` + strconv.Itoa(sandboxUID) +
			` --clear-groups --inh-caps=-all -- "$@"`
		cmd = exec.Command("unshare", append([]string{"--pid", "--fork", "--mount", "--ipc", "--mount-proc",
			"--propagation", "private", "--", "sh", "-c", script, "sh", bin}, args...)...)
		c = client.New("http://127.0.0.1:"+strconv.Itoa(port), token)
	case ModeDaemon:
		sock := filepath.Join(root, "daemon.sock")
		cmd = exec.Command(bin, append(args, "--socket", sock)...)
		c = client.NewUnix(sock, token)
	}
	cmd.Env = append(os.Environ(), "WARMPOOL_AGENT_TOKEN="+token, "TMPDIR="+scratch, "HOME="+root)
	log, err := os.Create(filepath.Join(root, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// In the sandbox mode the agent is unshare's child and the init of its
		// PID namespace, which ends with it: killed first (unshare's own
		// death would not end it: setpriv's change of user clears a parent-death
		// signal).
		for _, pid := range children(cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("agent log (last 6000 bytes):\n%s", b[max(0, len(b)-6000):])
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var h *protocol.Health
	for {
		if h, err = c.Ready(ctx); err == nil && h.OK {
			break
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("the %s agent never became ready: %v\n%s", mode, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a := &agent{mode: mode, c: c, workspace: ws, containment: h.Containment}
	a.pid = cmd.Process.Pid
	if mode == ModeSandbox { // the agent is unshare's child
		if kids := children(cmd.Process.Pid); len(kids) == 1 {
			a.pid = kids[0]
		} else {
			t.Fatalf("unshare's children: %v", kids)
		}
	}
	t.Logf("%s agent: pid %d, containment %q", mode, a.pid, a.containment)
	// The baseline: after a few runs, idle.
	for i := 0; i < 3; i++ {
		a.exec(t, protocol.ExecuteRequest{Code: "6 * 7"})
	}
	time.Sleep(200 * time.Millisecond)
	a.base = a.usage(t)
	return a
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func children(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func (a *agent) exec(t *testing.T, req protocol.ExecuteRequest) *protocol.Result {
	t.Helper()
	a.seq++
	if req.ID == "" {
		req.ID = fmt.Sprintf("corpus-%d", a.seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := a.c.Execute(ctx, req)
	if err != nil {
		t.Fatalf("execute %.60q: %v", req.Code, err)
	}
	return res
}

// run runs one program and checks everything it must end in.
func (a *agent) run(t *testing.T, p *Program) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A fresh interpreter with a variable the program's run may keep or lose.
	if err := a.c.Reset(ctx); err != nil {
		t.Fatalf("reset before the program: %v", err)
	}
	if res := a.exec(t, protocol.ExecuteRequest{Code: "kept = 'yes'"}); res.Status != protocol.StatusSucceeded || res.StateLost {
		t.Fatalf("setup run: %+v", res)
	}

	a.seq++
	start := time.Now()
	res := a.exec(t, p.Request(fmt.Sprintf("corpus-%d", a.seq)))
	took := time.Since(start)
	errType := ""
	if res.Error != nil {
		errType = res.Error.Type
	}
	describe := func() string {
		return fmt.Sprintf("%s (%s)\n  status %s, stateLost %v (%q), error %s %+v, took %s\n  stdout %.300q\n  stderr %.300q\n  result %v",
			p.Name, p.Description, res.Status, res.StateLost, res.StateLostReason, errType, res.Error, took.Round(time.Millisecond),
			res.Stdout, res.Stderr, deref(res.Result))
	}
	if want := p.WantStatus(a.containment); res.Status != want {
		t.Errorf("status %s, want %s: %s", res.Status, want, describe())
	}
	if res.StateLost != p.StateLost {
		t.Errorf("stateLost %v, want %v: %s", res.StateLost, p.StateLost, describe())
	}
	if res.StateLost && res.StateLostReason == "" {
		t.Errorf("the state is lost without a reason: %s", describe())
	}
	if p.Reason != "" && !strings.Contains(res.StateLostReason, p.Reason) {
		t.Errorf("stateLostReason lacks %q: %s", p.Reason, describe())
	}
	if p.ErrorType != "" && errType != p.ErrorType {
		t.Errorf("error type %q, want %q: %s", errType, p.ErrorType, describe())
	}
	if took > p.Within {
		t.Errorf("took %s, more than %s: %s", took.Round(time.Millisecond), p.Within, describe())
	}
	if p.Stdout != nil && res.Stdout != *p.Stdout {
		t.Errorf("stdout %q, want %q: %s", res.Stdout, *p.Stdout, describe())
	}
	if p.StdoutHas != "" && !strings.Contains(res.Stdout, p.StdoutHas) {
		t.Errorf("stdout lacks %q: %s", p.StdoutHas, describe())
	}
	if p.Result != nil && deref(res.Result) != *p.Result {
		t.Errorf("result %s, want %s: %s", deref(res.Result), *p.Result, describe())
	}
	if p.APIRead != "" {
		a.checkFileAPIRefuses(t, p.APIRead)
	}
	time.Sleep(p.Pause)

	if p.HandOver {
		if err := a.c.ResetForReuse(ctx); err != nil {
			t.Fatalf("the hand-over failed: %v", err)
		}
		check := a.exec(t, protocol.ExecuteRequest{Code: p.Check, TimeoutMillis: 20000})
		if check.Status != protocol.StatusSucceeded || deref(check.Result) != "'clean'" || check.StateLost {
			t.Errorf("the next user found the last one's traces: %s %s %+v stdout %q", check.Status, deref(check.Result), check.Error, check.Stdout)
		}
	} else {
		a.checkNext(t, p, res)
	}
	a.checkAgent(t)
}

// checkNext runs the next request and checks it finds the state exactly when
// nothing said it was lost, and says what was lost when something did.
func (a *agent) checkNext(t *testing.T, p *Program, res *protocol.Result) {
	t.Helper()
	req := protocol.ExecuteRequest{Code: "('kept' in globals(), 6 * 7)", TimeoutMillis: 20000}
	want := protocol.StatusSucceeded
	if p.NextCode != "" {
		req.Code, want = p.NextCode, p.NextStatus
		if p.NextTimeout > 0 {
			req.TimeoutMillis = p.NextTimeout.Milliseconds()
		}
	}
	next := a.exec(t, req)
	if next.Status != want {
		t.Errorf("the next run: status %s, want %s (%+v, stdout %q)", next.Status, want, next.Error, next.Stdout)
	}
	if next.StateLost != p.NextStateLost {
		t.Errorf("the next run: stateLost %v (%q), want %v", next.StateLost, next.StateLostReason, p.NextStateLost)
	}
	if p.NextReason != "" && !strings.Contains(next.StateLostReason, p.NextReason) {
		t.Errorf("the next run's stateLostReason %q lacks %q", next.StateLostReason, p.NextReason)
	}
	if p.NextCode == "" {
		kept := !res.StateLost && !next.StateLost
		if w := fmt.Sprintf("(%s, 42)", pyBool(kept)); deref(next.Result) != w {
			t.Errorf("the next run found %s, want %s: state kept must be said lost exactly when it is", deref(next.Result), w)
		}
	}
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// checkFileAPIRefuses reads and writes a path through the file API: a FIFO
// (or a socket) there must be refused at once, not hold the agent.
func (a *agent) checkFileAPIRefuses(t *testing.T, path string) {
	t.Helper()
	for _, m := range []string{http.MethodGet, http.MethodPut} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		p, body := protocol.PathFileRead, io.Reader(nil)
		if m == http.MethodPut {
			p, body = protocol.PathFileWrite, strings.NewReader("x")
		}
		start := time.Now()
		resp, err := a.c.Raw(ctx, m, p+"?path="+path, body, "application/octet-stream", "")
		cancel()
		var ae *client.APIError
		switch {
		case errors.As(err, &ae) && ae.Code >= 400 && ae.Code < 500:
		case err == nil && resp.StatusCode >= 400 && resp.StatusCode < 500:
			_ = resp.Body.Close()
		case err == nil:
			_ = resp.Body.Close()
			t.Errorf("%s %s answered %d, want a 4xx refusal", m, path, resp.StatusCode)
		default:
			t.Errorf("%s %s: %v after %s, want a 4xx refusal at once", m, path, err, time.Since(start).Round(time.Millisecond))
		}
	}
}

// usage is what the agent process holds.
type usage struct{ rss, threads, fds int }

func (a *agent) usage(t *testing.T) usage {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.pid))
	if err != nil {
		t.Fatalf("the agent (pid %d) is gone: %v", a.pid, err)
	}
	var u usage
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "VmRSS:":
			kb, _ := strconv.Atoi(f[1])
			u.rss = kb << 10
		case len(f) >= 2 && f[0] == "Threads:":
			u.threads, _ = strconv.Atoi(f[1])
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.pid))
	u.fds = len(fds)
	return u
}

// checkAgent: the same agent process, running, answering, and within bounds
// of its baseline (given a moment to let go of a run's goroutines).
func (a *agent) checkAgent(t *testing.T) {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.pid))
	if err != nil {
		t.Fatalf("the agent (pid %d) is gone: %v", a.pid, err)
	}
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 && len(stat) > i+2 && (stat[i+2] == 'T' || stat[i+2] == 't') {
		t.Fatalf("the agent is stopped (%c)", stat[i+2])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.c.Health(ctx); err != nil {
		t.Fatalf("the agent does not answer: %v", err)
	}
	var u usage
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		u = a.usage(t)
		if u.rss <= a.base.rss+rssBound && u.threads <= a.base.threads+threadsBound && u.fds <= a.base.fds+fdsBound {
			t.Logf("agent after the program: RSS %.1f MiB, %d threads, %d fds (baseline %.1f MiB, %d, %d)",
				float64(u.rss)/(1<<20), u.threads, u.fds, float64(a.base.rss)/(1<<20), a.base.threads, a.base.fds)
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("the agent holds RSS %d MiB, %d threads, %d fds; baseline %d MiB, %d, %d",
		u.rss>>20, u.threads, u.fds, a.base.rss>>20, a.base.threads, a.base.fds)
}
