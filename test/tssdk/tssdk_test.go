// Package tssdk runs the TypeScript client's suites (clients/typescript/test)
// as a user's project would: the package is packed (npm pack), installed from
// the tarball into a project of its own, and the behaviour suite runs against
// every backend: pyodide and native on this machine, daemon against the agent
// serving on a Unix socket, warmpool against a Session on envtest with real
// agents, through kube-apiserver's aggregation layer and a user's kubeconfig.
package tssdk

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/testing/nodejs"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// daemon serves the agent API on a Unix socket, as `agent serve --socket
// ~/.rlm/daemon.sock` does on a laptop, and returns the socket.
func daemon(t testing.TB, agent string) string {
	home := t.TempDir()
	socket := filepath.Join(home, ".rlm", "daemon.sock")
	cmd := exec.Command(agent, "serve", "--socket", socket, "--workers", "4")
	cmd.Env = append(os.Environ(), "HOME="+home)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the daemon: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get("http://daemon/v1/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return socket
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not answer on %s: %v\n%s", socket, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// backends brings up what the remote backends run on: warmpool on envtest
// with a warm pool "python" in a new namespace and a user's kubeconfig, and
// the daemon on its socket.
func backends(t testing.TB, prefix string) (ns, kubeconfig, socket string) {
	ctx := context.Background()
	s := stack.ForTest(t)
	ns, err := s.Namespace(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err = s.UserKubeconfig(ctx, ns, "ts-user", "session-editor-role")
	if err != nil {
		t.Fatal(err)
	}
	return ns, kubeconfig, daemon(t, s.Kubelet.AgentBinary)
}

func TestTypeScriptClient(t *testing.T) {
	path := nodejs.Path(t)
	if err := exec.Command("python3", "-c", "import matplotlib").Run(); err != nil {
		t.Fatal("the suites draw charts with the python3 on PATH, which needs matplotlib: apt-get install python3-matplotlib (make test does)")
	}
	if _, err := exec.LookPath("rg"); err != nil {
		t.Fatal("the BashKit suite needs ripgrep where envtest's agents run, as the sandbox image has it: apt-get install ripgrep (make test does)")
	}
	project := nodejs.Install(t, path)
	ns, user, socket := backends(t, "tssdk-")

	var extra []string
	if f := os.Getenv("WARMPOOL_NODE_TEST_ARGS"); f != "" {
		extra = strings.Fields(f)
	}
	out, err := nodejs.Test(project, path, []string{
		"WARMPOOL_TS_BACKENDS=native,pyodide,daemon,warmpool",
		"WARMPOOL_TS_DAEMON_SOCKET=" + socket,
		"WARMPOOL_TEST_KUBECONFIG=" + user,
		"WARMPOOL_TEST_NAMESPACE=" + ns,
		"WARMPOOL_TEST_POOL=python",
		"WARMPOOL_REPO=" + testenv.RepoRoot(),
		// The recovery cases build the scripted data plane with it.
		"GO=" + filepath.Join(runtime.GOROOT(), "bin", "go"),
		// Debian's matplotlib is where envtest's agents and the native
		// backend run (make test installs it): charts come back.
		"WARMPOOL_TEST_MATPLOTLIB=1",
		// No kubeconfig of the machine's may leak in: the suites name theirs.
		"KUBECONFIG=" + filepath.Join(t.TempDir(), "none"),
	}, extra...)
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript client's suites failed: %v", err)
	}
}

// BenchmarkTypeScriptBackends runs clients/typescript/bench/backends.mjs once
// (it times its own calls: WARMPOOL_TS_BENCH_RUNS, default 500) against all
// four backends side by side, and logs its JSON report:
//
//	go test ./test/tssdk -run '^$' -bench TypeScriptBackends -benchtime 1x -v
func BenchmarkTypeScriptBackends(b *testing.B) {
	path := nodejs.Path(b)
	src := nodejs.Source()
	nodejs.Run(b, src, path, nil, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund")
	nodejs.Run(b, src, path, nil, "npm", "run", "build")
	ns, user, socket := backends(b, "tsbench-")
	for i := 0; i < b.N; i++ {
		out := nodejs.Run(b, src, path, []string{
			"WARMPOOL_TS_BACKENDS=native,pyodide,daemon,warmpool",
			"WARMPOOL_TS_DAEMON_SOCKET=" + socket,
			"WARMPOOL_TEST_KUBECONFIG=" + user,
			"WARMPOOL_TEST_NAMESPACE=" + ns,
			"WARMPOOL_TEST_POOL=python",
			"KUBECONFIG=" + filepath.Join(b.TempDir(), "none"),
		}, "node", "--expose-gc", "bench/backends.mjs")
		b.Logf("report:\n%s", out)
	}
}
