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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// nodePath returns a PATH with node >= 20 and npm first: $WARMPOOL_NODE_DIR
// (which `make test` sets from hack/node.sh) or the machine's own.
func nodePath(t *testing.T) string {
	path := os.Getenv("PATH")
	if dir := os.Getenv("WARMPOOL_NODE_DIR"); dir != "" {
		path = dir + string(os.PathListSeparator) + path
	}
	cmd := exec.Command("node", "-e", "process.stdout.write(process.versions.node.split('.')[0])")
	cmd.Env = append(os.Environ(), "PATH="+path)
	out, err := cmd.Output()
	major, _ := strconv.Atoi(string(out))
	if err != nil || major < 20 {
		t.Fatalf("the TypeScript client's tests need node >= 20 and npm (hack/node.sh finds or fetches them, as `make test` does): node: %v %s", err, out)
	}
	return path
}

func run(t *testing.T, dir, path string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "PATH="+path, "npm_config_update_notifier=false"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

// install packs clients/typescript and installs the tarball into a new
// project, with the suites copied next to it; returns the project.
func install(t *testing.T, path string) string {
	src := filepath.Join(testenv.RepoRoot(), "clients", "typescript")
	run(t, src, path, nil, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund")
	packs := t.TempDir()
	out := run(t, src, path, nil, "npm", "pack", "--silent", "--pack-destination", packs)
	lines := strings.Fields(strings.TrimSpace(out))
	if len(lines) == 0 {
		t.Fatalf("npm pack named no tarball:\n%s", out)
	}
	tarball := filepath.Join(packs, lines[len(lines)-1])

	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"),
		[]byte(`{"name": "tssdk-user", "private": true, "type": "module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, project, path, nil, "npm", "install", "--prefer-offline", "--no-audit", "--no-fund", tarball)
	if err := os.CopyFS(filepath.Join(project, "test"), os.DirFS(filepath.Join(src, "test"))); err != nil {
		t.Fatalf("copy the suites: %v", err)
	}
	return project
}

// daemon serves the agent API on a Unix socket, as `agent serve --socket
// ~/.rlm/daemon.sock` does on a laptop, and returns the socket.
func daemon(t *testing.T, agent string) string {
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

func TestTypeScriptClient(t *testing.T) {
	path := nodePath(t)
	if _, err := exec.LookPath("rg"); err != nil {
		t.Fatal("the BashKit suite needs ripgrep where envtest's agents run, as the sandbox image has it: apt-get install ripgrep (make test does)")
	}
	project := install(t, path)
	ctx := context.Background()
	s := stack.ForTest(t)

	ns, err := s.Namespace(ctx, "tssdk-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	user, err := s.UserKubeconfig(ctx, ns, "ts-user", "session-editor-role")
	if err != nil {
		t.Fatal(err)
	}
	socket := daemon(t, s.Kubelet.AgentBinary)

	args := []string{"--test", "--test-reporter=spec", "--test-reporter-destination=stdout"}
	if f := os.Getenv("WARMPOOL_NODE_TEST_ARGS"); f != "" {
		args = append(args, strings.Fields(f)...)
	}
	args = append(args, "test/")
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = project
	cmd.Env = append(os.Environ(),
		"PATH="+path,
		"WARMPOOL_TS_BACKENDS=native,pyodide,daemon,warmpool",
		"WARMPOOL_TS_DAEMON_SOCKET="+socket,
		"WARMPOOL_TEST_KUBECONFIG="+user,
		"WARMPOOL_TEST_NAMESPACE="+ns,
		"WARMPOOL_TEST_POOL=python",
		"WARMPOOL_REPO="+testenv.RepoRoot(),
		// No kubeconfig of the machine's may leak in: the suites name theirs.
		"KUBECONFIG="+filepath.Join(t.TempDir(), "none"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("the TypeScript client's suites failed: %v", err)
	}
}
