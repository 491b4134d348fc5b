package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// buildAgent builds the real binary once per test run.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	return bin
}

func TestDaemonOverUnixSocket(t *testing.T) {
	bin := buildAgent(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "rlm", "daemon.sock")
	daemon := exec.Command(bin, "serve", "--socket", sock, "--workers", "2")
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })

	c := client.NewUnix(sock, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the daemon never created its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	h, err := c.Ready(ctx)
	if err != nil || h.Workers != 2 {
		t.Fatalf("ready: %+v %v", h, err)
	}

	// The CLI against the daemon: state persists within a session.
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"exec", "--socket", sock}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	if out, code := run("--session", "s", "-c", "x = 41\nprint('set')"); code != 0 || out != "set\n" {
		t.Fatalf("exec: %d %q", code, out)
	}
	if out, code := run("--session", "s", "-c", "x + 1"); code != 0 || out != "42\n" {
		t.Fatalf("exec: %d %q", code, out)
	}
	if out, code := run("-c", "1/0"); code != 1 || !strings.Contains(out, "ZeroDivisionError") {
		t.Fatalf("exec error: %d %q", code, out)
	}
	if out, code := run("--timeout", "200ms", "-c", "while True: pass"); code != 124 || !strings.Contains(out, "KeyboardInterrupt") {
		t.Fatalf("exec timeout: %d %q", code, out)
	}
	script := filepath.Join(dir, "s.py")
	_ = os.WriteFile(script, []byte("print('from file')\n"), 0o644)
	if out, code := run(script); code != 0 || out != "from file\n" {
		t.Fatalf("exec file: %d %q", code, out)
	}
	res, err := c.Execute(ctx, protocol.ExecuteRequest{Code: "echo hi", Language: protocol.LanguageShell})
	if err != nil || res.Stdout != "hi\n" {
		t.Fatalf("shell via daemon: %+v %v", res, err)
	}
}

func TestExecInProcessWithoutDaemon(t *testing.T) {
	bin := buildAgent(t)
	out, err := exec.Command(bin, "exec", "--socket", filepath.Join(t.TempDir(), "none.sock"), "-c", "print('in-process'); 2*21").CombinedOutput()
	if err != nil || string(out) != "in-process\n42\n" {
		t.Fatalf("%v %q", err, out)
	}
}

func TestServeTCPRequiresAToken(t *testing.T) {
	bin := buildAgent(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--workspace", t.TempDir())
	cmd.Env = append(os.Environ(), "WARMPOOL_AGENT_TOKEN=", "WARMPOOL_TRUSTED_KEYS=", "WARMPOOL_POD_UID=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "serving TCP needs --trusted-keys and --pod-uid, a token") {
		t.Fatalf("%v %q", err, out)
	}
	// Trusted keys without the pod's UID would accept tokens for any pod: refused.
	cmd = exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--workspace", t.TempDir(),
		"--trusted-keys", "k1=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	cmd.Env = append(os.Environ(), "WARMPOOL_POD_UID=")
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no audience") {
		t.Fatalf("%v %q", err, out)
	}
}

// BenchmarkAgentIdleRSS reports the resident memory of the agent binary
// itself (not its python3 child) while idle with a warm interpreter.
func BenchmarkAgentIdleRSS(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	for i := 0; i < b.N; i++ {
		sock := filepath.Join(b.TempDir(), "d.sock")
		cmd := exec.Command(bin, "serve", "--socket", sock)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		c := client.NewUnix(sock, "")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for _, err := os.Stat(sock); err != nil && ctx.Err() == nil; _, err = os.Stat(sock) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 100; j++ {
			if _, err := c.Execute(ctx, protocol.ExecuteRequest{Code: "print(1)"}); err != nil {
				b.Fatal(err)
			}
		}
		cancel()
		time.Sleep(500 * time.Millisecond)
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "status"))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				kb, _ := strconv.Atoi(strings.Fields(line)[1])
				b.ReportMetric(float64(kb)/1024, "agent-RSS-MB")
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// A socket its agent left behind (killed without removing it) is found out:
// exec runs in-process and says so, and serve replaces it. A live daemon's
// socket is not taken over.
func TestStaleDaemonSocket(t *testing.T) {
	bin := buildAgent(t)
	sock := filepath.Join(t.TempDir(), "rlm", "daemon.sock")
	start := func() *exec.Cmd {
		t.Helper()
		d := exec.Command(bin, "serve", "--socket", sock)
		d.Stderr = os.Stderr
		if err := d.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait() }) // a second Kill and Wait are harmless
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, err := os.Stat(sock); err != nil; _, err = os.Stat(sock) {
			if ctx.Err() != nil {
				t.Fatal("no socket")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := client.NewUnix(sock, "").WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := start()
	// Another serve on the same socket refuses, and the daemon still answers.
	out, err := exec.Command(bin, "serve", "--socket", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already serves") {
		t.Fatalf("a second serve: %v %q", err, out)
	}
	_ = d.Process.Kill() // SIGKILL: the socket stays
	_ = d.Wait()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the killed daemon's socket is gone: %v", err)
	}
	cmd := exec.Command(bin, "exec", "--socket", sock, "-c", "print('ran'); 6 * 7")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stdout.String() != "ran\n42\n" || !strings.Contains(stderr.String(), "stale socket") {
		t.Fatalf("exec with a stale socket: %v stdout %q stderr %q", err, stdout.String(), stderr.String())
	}
	start() // replaces the stale socket
	out, err = exec.Command(bin, "exec", "--socket", sock, "-c", "import os; os.getpid() != 0").CombinedOutput()
	if err != nil || string(out) != "True\n" {
		t.Fatalf("exec via the new daemon: %v %q", err, out)
	}
}
