package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agent/interpreter"
	"github.com/warmpool/warmpool/internal/agent/workspace"
	"github.com/warmpool/warmpool/pkg/protocol"
)

const token = "s3cret"

type agent struct {
	url string
	c   *client.Client
	ws  string
}

func startAgent(t testing.TB, workers int, preload ...string) *agent {
	t.Helper()
	return startAgentWith(t, workers, nil, preload...)
}

func startAgentWith(t testing.TB, workers int, scratch []string, preload ...string) *agent {
	t.Helper()
	dir := t.TempDir()
	ws, err := workspace.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var interps []*interpreter.Interpreter
	for i := 0; i < workers; i++ {
		it := interpreter.New(interpreter.Config{Dir: dir, Preload: preload, DefaultGrace: time.Second, Log: testr.NewWithInterface(t, testr.Options{})})
		_ = it.Start()
		t.Cleanup(it.Close)
		interps = append(interps, it)
	}
	srv := New(Config{Token: token, Workers: interps, Workspace: ws, ScratchDirs: scratch, Log: testr.NewWithInterface(t, testr.Options{})})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &agent{url: hs.URL, c: client.New(hs.URL, token), ws: dir}
}

// raw sends a request and returns the status and decoded JSON error body.
func raw(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		var eb protocol.ErrorBody
		if err := json.Unmarshal(data, &eb); err != nil || eb.Error == "" {
			t.Fatalf("%s %s: status %d without a JSON error body: %q", method, url, resp.StatusCode, data)
		}
		return resp.StatusCode, eb.Error
	}
	return resp.StatusCode, string(data)
}

func TestAuth(t *testing.T) {
	a := startAgent(t, 1)
	body := `{"code":"1"}`
	for _, auth := range []string{"", "Bearer wrong", "Basic " + token, token} {
		if code, msg := raw(t, "POST", a.url+protocol.PathExecute, auth, body); code != 401 || !strings.Contains(msg, "token") {
			t.Errorf("auth %q: %d %s", auth, code, msg)
		}
	}
	if code, _ := raw(t, "POST", a.url+protocol.PathExecute, "Bearer "+token, body); code != 200 {
		t.Errorf("right token: %d", code)
	}
	// Probes carry no token, and say which build and contract version answers.
	code, body := raw(t, "GET", a.url+protocol.PathHealthz, "", "")
	var h protocol.Health
	if err := json.Unmarshal([]byte(body), &h); code != 200 || err != nil || h.Protocol != protocol.Version || h.Agent == "" {
		t.Errorf("healthz: %d %s", code, body)
	}
	if code, _ := raw(t, "GET", a.url+protocol.PathReadyz, "", ""); code != 200 {
		t.Errorf("readyz: %d", code)
	}
}

func TestBadRequestsGet4xxWithAMessage(t *testing.T) {
	a := startAgent(t, 1)
	auth := "Bearer " + token
	for _, tc := range []struct {
		method, path, body string
		code               int
		msg                string
	}{
		{"POST", protocol.PathExecute, `{"code":`, 400, "invalid JSON"},
		{"POST", protocol.PathExecute, `{"code":"1","bogus":1}`, 400, `unknown field "bogus"`},
		{"POST", protocol.PathExecute, `{"code":"  "}`, 400, "code is required"},
		{"POST", protocol.PathExecute, `{"code":"1","language":"ruby"}`, 400, `language "ruby" is not supported`},
		{"POST", protocol.PathExecute, `{"code":"1","timeoutMillis":-1}`, 400, "must not be negative"},
		{"POST", protocol.PathExecute, `{"code":"1","timeoutMillis":999999999999}`, 400, "above the maximum"},
		{"POST", protocol.PathExecute, `{"code":"1","id":"a b"}`, 400, "id must be"},
		{"POST", protocol.PathExecute, `{"code":"1","bridge":true}`, 400, "bridge needs a streaming execute"},
		{"POST", protocol.PathExecute, `{"code":"1","bridgeMethods":["read_chunk"]}`, 400, "bridgeMethods needs bridge"},
		{"POST", protocol.PathExecute, `{"code":"1","stream":true,"bridge":true,"bridgeMethods":["__import__"]}`, 400, `"__import__" is not a memory function`},
		{"POST", protocol.PathExecute, `{"code":"1"} {"code":"2"}`, 400, "more than one JSON value"},
		{"GET", "/v1/variables/1abc", "", 400, "not a Python identifier"},
		{"GET", "/v1/variables/nope", "", 404, `no variable "nope"`},
		{"GET", "/v1/executions/unknown", "", 404, "no execution with this id"},
		{"POST", "/v1/executions/unknown/interrupt", "", 404, "no execution"},
		{"POST", "/v1/executions/unknown/bridge/b1", `{"result":1}`, 404, "no execution"},
		{"GET", "/v1/nothing", "", 404, "no such endpoint"},
		{"POST", protocol.PathShell, `{"command":""}`, 400, "command is required"},
		{"GET", protocol.PathFileRead + "?path=../../etc/passwd", "", 400, "escapes the workspace"},
		{"GET", protocol.PathFileRead + "?path=missing.txt", "", 404, "no such file"},
		{"GET", protocol.PathFileList + "?path=..", "", 400, "escapes the workspace"},
		{"PUT", protocol.PathFileWrite + "?path=../x", "data", 400, "escapes the workspace"},
	} {
		code, msg := raw(t, tc.method, a.url+tc.path, auth, tc.body)
		if code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s %s %s: got %d %q, want %d containing %q", tc.method, tc.path, tc.body, code, msg, tc.code, tc.msg)
		}
	}
}

func TestSymlinkEscapeIsRefused(t *testing.T) {
	a := startAgent(t, 1)
	if err := os.Symlink("/etc", filepath.Join(a.ws, "etc")); err != nil {
		t.Fatal(err)
	}
	code, msg := raw(t, "GET", a.url+protocol.PathFileRead+"?path=etc/hostname", "Bearer "+token, "")
	if code != 400 || !strings.Contains(msg, "escapes") {
		t.Fatalf("got %d %q", code, msg)
	}
}

func TestFiles(t *testing.T) {
	a := startAgent(t, 1)
	auth := "Bearer " + token
	if code, _ := raw(t, "PUT", a.url+protocol.PathFileWrite+"?path=/data/in.csv", auth, "a,b\n1,2\n"); code != 200 {
		t.Fatalf("write: %d", code)
	}
	// The code sees the file in its working directory.
	res, err := a.c.Execute(context.Background(), protocol.ExecuteRequest{Code: "open('data/in.csv').read().splitlines()[1]"})
	if err != nil || *res.Result != "'1,2'" {
		t.Fatalf("code reading the file: %+v %v", res, err)
	}
	if code, body := raw(t, "GET", a.url+protocol.PathFileRead+"?path=data/in.csv", auth, ""); code != 200 || body != "a,b\n1,2\n" {
		t.Fatalf("read: %d %q", code, body)
	}
	_, body := raw(t, "GET", a.url+protocol.PathFileList+"?path=/data", auth, "")
	var list []protocol.FileInfo
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].Path != "/data/in.csv" || list[0].Size != 8 {
		t.Fatalf("list: %s", body)
	}
	_, body = raw(t, "GET", a.url+protocol.PathFileStat+"?path=data", auth, "")
	var fi protocol.FileInfo
	if err := json.Unmarshal([]byte(body), &fi); err != nil || !fi.Dir {
		t.Fatalf("stat: %s", body)
	}
}

func TestExecuteIsIdempotentByID(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	if _, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "runs = 0"}); err != nil {
		t.Fatal(err)
	}
	req := protocol.ExecuteRequest{ID: "exec-uid-1", Code: "import time\nruns += 1\ntime.sleep(0.3)\nruns"}
	var wg sync.WaitGroup
	results := make([]*protocol.Result, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := a.c.Execute(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = res
		}()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	for _, r := range results {
		if r == nil || r.Status != protocol.StatusSucceeded || *r.Result != "1" {
			t.Fatalf("result: %+v", r)
		}
	}
	// Again after it finished: the stored result, not a second run.
	again, err := a.c.Execute(ctx, req)
	if err != nil || *again.Result != "1" {
		t.Fatalf("again: %+v %v", again, err)
	}
	v, err := a.c.Variable(ctx, "runs")
	if err != nil || string(v.JSON) != "1" {
		t.Fatalf("the code ran more than once: runs=%s err=%v", v.JSON, err)
	}
	info, err := a.c.Execution(ctx, "exec-uid-1")
	if err != nil || info.Running || info.Result == nil {
		t.Fatalf("execution info: %+v %v", info, err)
	}
}

func TestConcurrentExecuteGets409(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	go func() {
		_, _ = a.c.Execute(ctx, protocol.ExecuteRequest{ID: "slow", Code: "import time; time.sleep(0.5)"})
	}()
	waitRunning(t, a, "slow")
	_, err := a.c.Execute(ctx, protocol.ExecuteRequest{ID: "other", Code: "1"})
	if !client.IsStatus(err, http.StatusConflict) || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("err = %v, want 409", err)
	}
}

func waitRunning(t *testing.T, a *agent, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if info, err := a.c.Execution(context.Background(), id); err == nil && info.Running {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("execution %s never ran", id)
}

func TestInterruptEndpoint(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	done := make(chan *protocol.Result)
	started := make(chan struct{})
	go func() {
		var once sync.Once
		res, _ := a.c.ExecuteStream(ctx, protocol.ExecuteRequest{ID: "loop", Code: "import sys\nsys.stdout.write('started\\n'); sys.stdout.flush()\nwhile True: pass"},
			func(ev protocol.Event) {
				if ev.Type == protocol.EventStdout {
					once.Do(func() { close(started) })
				}
			})
		done <- res
	}()
	<-started // the code runs its loop now (one write: print() may write the text and its newline apart)
	if err := a.c.Interrupt(ctx, "loop"); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Status != protocol.StatusInterrupted || res.Error.Type != "KeyboardInterrupt" || res.Stdout != "started\n" {
		t.Fatalf("result: %+v", res)
	}
}

func TestStreamingEventsAndBridge(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	var events []protocol.Event
	req := protocol.ExecuteRequest{ID: "s1", Bridge: true, Context: json.RawMessage(`"the context"`),
		Code: "import sys\nprint('one', flush=True)\nprint('warn', file=sys.stderr, flush=True)\nanswer = llm_query('2+2?')\nsub = rlm_query('sub')\nprint(answer)\nsub"}
	res, err := a.c.ExecuteStream(ctx, req, func(ev protocol.Event) {
		events = append(events, ev)
		if ev.Type == protocol.EventBridge {
			var p map[string]any
			_ = json.Unmarshal(ev.Call.Params, &p)
			answer, _ := json.Marshal(fmt.Sprintf("%s:%v:%v", ev.Call.Method, p["prompt"], p["context"]))
			go func() {
				if err := a.c.AnswerBridge(ctx, "s1", ev.Call.ID, protocol.BridgeAnswer{Result: answer}); err != nil {
					t.Error(err)
				}
			}()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || *res.Result != "'rlm_query:<nil>:the context'" || res.Stdout != "one\nllm_query:2+2?:<nil>\n" {
		t.Fatalf("result: %+v", res)
	}
	var kinds []string
	for _, ev := range events {
		kinds = append(kinds, ev.Type)
	}
	// stdout, stderr and the protocol are separate pipes, so the order between
	// them is not kept; each stream's own order is.
	counts := map[string]int{}
	var streamed string
	for _, ev := range events {
		counts[ev.Type]++
		if ev.Type == protocol.EventStdout {
			streamed += ev.Data
		}
	}
	if counts[protocol.EventBridge] != 2 || counts[protocol.EventStderr] == 0 || kinds[len(kinds)-1] != protocol.EventResult ||
		streamed != res.Stdout {
		t.Fatalf("events: %v, streamed stdout %q", kinds, streamed)
	}
}

func TestVariableAndReset(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	if _, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "x = {'k': [1, 2]}"}); err != nil {
		t.Fatal(err)
	}
	v, err := a.c.Variable(ctx, "x")
	if err != nil || string(v.JSON) != `{"k":[1,2]}` || v.Type != "dict" {
		t.Fatalf("variable: %+v %v", v, err)
	}
	if err := a.c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Variable(ctx, "x"); !client.IsStatus(err, 404) {
		t.Fatalf("after reset: %v", err)
	}
}

func TestShell(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	res, err := a.c.Shell(ctx, protocol.ShellRequest{Command: "echo out; echo err >&2; pwd; exit 3"})
	if err != nil || res.ExitCode != 3 || res.Stdout != "out\n"+a.ws+"\n" || res.Stderr != "err\n" {
		t.Fatalf("shell: %+v %v", res, err)
	}
	res, err = a.c.Shell(ctx, protocol.ShellRequest{Command: "echo before; sleep 10", TimeoutMillis: 200})
	if err != nil || !res.TimedOut || res.Stdout != "before\n" || res.DurationMillis > 3000 {
		t.Fatalf("shell timeout: %+v %v", res, err)
	}
	// language: shell through execute.
	ex, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "echo $GREETING; exit 2", Language: "shell", Env: map[string]string{"GREETING": "hi"}})
	if err != nil || ex.Status != protocol.StatusFailed || *ex.ExitCode != 2 || ex.Stdout != "hi\n" {
		t.Fatalf("shell execute: %+v %v", ex, err)
	}
}

// A pod that passes to another user (reusePolicy FreshInterpreter) keeps
// none of its files: a reset with wipe empties the workspace and the scratch
// directories, whatever the code did to them; a plain reset keeps them.
func TestResetForReuseEmptiesWorkspaceAndScratch(t *testing.T) {
	tmp, outside := t.TempDir(), t.TempDir()
	a := startAgentWith(t, 1, []string{tmp})
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("not the sandbox's"), 0o600); err != nil {
		t.Fatal(err)
	}
	code := fmt.Sprintf(`import os
open('secret.txt', 'w').write('alice')
open(os.path.join(%[1]q, 'secret.tmp'), 'w').write('alice')
os.makedirs('locked/deeper')
open('locked/deeper/f', 'w').write('x')
os.chmod('locked/deeper', 0)
os.chmod('locked', 0)
os.symlink(%[2]q, 'link-out')
os.symlink(%[2]q, os.path.join(%[1]q, 'link-out'))
x = 1`, tmp, outside)
	if res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: code}); err != nil || res.Status != protocol.StatusSucceeded {
		t.Fatalf("write files: %+v %v", res, err)
	}
	if err := a.c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.ws, "secret.txt")); err != nil {
		t.Fatalf("a plain reset (a Session's own) keeps its files: %v", err)
	}
	if err := a.c.ResetForReuse(ctx); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{a.ws, tmp} {
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			t.Errorf("%s after a reset for reuse: %v %v", dir, entries, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "not the sandbox's" {
		t.Errorf("a link's target outside the sandbox was touched: %q %v", b, err)
	}
	res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "'x' in globals()"})
	if err != nil || res.Result == nil || *res.Result != "False" {
		t.Errorf("the interpreter is fresh too: %+v %v", res, err)
	}
}

// busy is what /readyz says of the agent's runs in progress.
func busy(t *testing.T, a *agent) int {
	t.Helper()
	resp, err := http.Get(a.url + protocol.PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var h protocol.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h.Busy
}

// A Session's idle timeout counts from the agent's last activity unless it
// reports a run in progress: shell commands are runs too.
func TestShellRunsCountAsBusy(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	for name, run := range map[string]func() error{
		"shell": func() error {
			_, err := a.c.Shell(ctx, protocol.ShellRequest{Command: "touch started; sleep 1"})
			return err
		},
		"execute shell": func() error {
			_, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "touch started; sleep 1", Language: "shell"})
			return err
		},
	} {
		_ = os.Remove(filepath.Join(a.ws, "started"))
		done := make(chan error, 1)
		go func() { done <- run() }()
		for {
			if _, err := os.Stat(filepath.Join(a.ws, "started")); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := busy(t, a); got != 1 {
			t.Errorf("%s: busy %d while the command runs, want 1", name, got)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := busy(t, a); got != 0 {
			t.Errorf("%s: busy %d after the command, want 0", name, got)
		}
	}
}

func TestReadinessReportsFailedPreload(t *testing.T) {
	a := startAgent(t, 1, "no_such_module_abc")
	resp, err := http.Get(a.url + protocol.PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var h protocol.Health
	_ = json.NewDecoder(resp.Body).Decode(&h)
	if resp.StatusCode != 503 || h.OK || !strings.Contains(h.Message, "no_such_module_abc") {
		t.Fatalf("readyz: %d %+v", resp.StatusCode, h)
	}
}

func TestWorkersRunInParallelAndSessionsStick(t *testing.T) {
	a := startAgent(t, 2)
	ctx := context.Background()
	for _, s := range []string{"alice", "bob"} {
		if _, err := a.c.Execute(ctx, protocol.ExecuteRequest{Session: s, Code: fmt.Sprintf("who = %q", s)}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for _, s := range []string{"alice", "bob"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Session: s, Code: "import time; time.sleep(0.4); who"})
			if err != nil || *res.Result != fmt.Sprintf("'%s'", s) {
				t.Errorf("session %s: %+v %v", s, res, err)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 750*time.Millisecond {
		t.Fatalf("two workers ran two executions in %s: not in parallel", d)
	}
}

// A caller that sends its next request as soon as it has a result must never
// find the interpreter still marked busy.
func TestBackToBackExecutionsKeepState(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	if _, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "n = 0"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "n += 1\nn"})
		if err != nil || *res.Result != fmt.Sprint(i) {
			t.Fatalf("run %d: %+v %v", i, res, err)
		}
	}
}

// The agent must answer probes while user code burns CPU, or the kubelet would
// restart a pod whose code is merely busy.
func TestHealthAnswersWhileCodeBurnsCPU(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	go func() {
		_, _ = a.c.Execute(ctx, protocol.ExecuteRequest{ID: "burn", Code: "while True: pass", TimeoutMillis: 3000})
	}()
	waitRunning(t, a, "burn")
	for i := 0; i < 20; i++ {
		start := time.Now()
		code, _ := raw(t, "GET", a.url+protocol.PathHealthz, "", "")
		if code != 200 || time.Since(start) > time.Second {
			t.Fatalf("healthz: %d after %s", code, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.c.Interrupt(ctx, "burn"); err != nil {
		t.Fatal(err)
	}
}
