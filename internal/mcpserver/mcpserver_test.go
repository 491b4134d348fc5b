package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/mcpserver"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// The MCP server against warmpool on envtest with real agents, driven by the
// MCP Go SDK's own client: over stdio (the built command, as an agent host
// starts it) and over streamable HTTP (each caller's bearer token).
func TestMCPServer(t *testing.T) {
	ctx := context.Background()
	s := stack.ForTest(t)
	ns, err := s.Namespace(ctx, "mcp-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "warmpool-mcp")
	build := exec.Command("go", "build", "-o", bin, "./cmd/warmpool-mcp")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	kubeconfig, err := s.UserKubeconfig(ctx, ns, "mcp-user", "session-editor-role")
	if err != nil {
		t.Fatal(err)
	}
	stdio := stdioServer{bin: bin, kubeconfig: kubeconfig, ns: ns}
	t.Run("stdio", func(t *testing.T) { testStdio(t, s, stdio) })
	t.Run("stdio, protocol 2025-11-25", func(t *testing.T) { testOlderProtocol(t, stdio) })
	t.Run("rounds of llm_query", func(t *testing.T) { testRounds(t, stdio) })
	t.Run("streamable HTTP", func(t *testing.T) { testHTTP(t, s) })
	t.Run("streamable HTTP, clients gone without DELETE", func(t *testing.T) { testOneShotHTTP(t, s) })
}

// stdioServer starts the built warmpool-mcp as an agent host does.
type stdioServer struct{ bin, kubeconfig, ns string }

func (sv stdioServer) connect(t *testing.T, ctx context.Context, opts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(sv.bin, "--kubeconfig", sv.kubeconfig, "--namespace", sv.ns, "--pool", "python")
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts).
		Connect(ctx, &mcp.CommandTransport{Command: cmd}, sopts)
	if err != nil {
		t.Fatalf("connect over stdio: %v", err)
	}
	return cs
}

// capitals is the agent's model: it answers the code's llm_query through
// sampling and records the prompts.
type capitals struct {
	mu      sync.Mutex
	prompts []string
}

func (m *capitals) answer(prompt string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.prompts = append(m.prompts, prompt)
	switch {
	case strings.Contains(prompt, "France"):
		return "Paris"
	case strings.Contains(prompt, "Italy"):
		return "Rome"
	}
	return "I do not know"
}

func (m *capitals) asked() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.prompts...)
}

func (m *capitals) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			text := m.answer(req.Params.Messages[0].Content.(*mcp.TextContent).Text)
			return &mcp.CreateMessageResult{Model: "fake", Role: "assistant", Content: &mcp.TextContent{Text: text}}, nil
		},
	}
}

func testStdio(t *testing.T, s *stack.Stack, sv stdioServer) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	model := &capitals{}
	cs := sv.connect(t, ctx, model.options(), nil)
	defer func() { _ = cs.Close() }()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, ","); got != "get_variable,list_files,read_file,reset,run_code,write_file" {
		t.Fatalf("tools: %s", got)
	}

	// A matplotlib chart comes back as image content after the output's JSON,
	// and by its text and MIME types in the structured output.
	chart, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
		"code": "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nprint('drawn')"}})
	if err != nil || chart.IsError {
		t.Fatalf("run_code with a chart: %v %s", err, text(chart))
	}
	if len(chart.Content) != 2 {
		t.Fatalf("chart: %d contents, want the JSON text and one image", len(chart.Content))
	}
	img, ok := chart.Content[1].(*mcp.ImageContent)
	if !ok || img.MIMEType != "image/png" || !bytes.HasPrefix(img.Data, []byte("\x89PNG\r\n")) {
		t.Fatalf("chart content: %#v", chart.Content[1])
	}
	var chartOut mcpserver.RunCodeOutput
	if err := json.Unmarshal([]byte(chart.Content[0].(*mcp.TextContent).Text), &chartOut); err != nil || chartOut.Stdout != "drawn\n" ||
		len(chartOut.Results) != 1 || fmt.Sprint(chartOut.Results[0].MIMETypes) != "[image/png text/plain]" {
		t.Fatalf("chart output: %v %+v", err, chartOut)
	}

	out := call(t, cs, "run_code", map[string]any{"code": "import math\nx = 6 * 7\nprint('hi')"}, false)
	if out["status"] != "succeeded" || out["stdout"] != "hi\n" {
		t.Fatalf("run_code: %v", out)
	}
	if out := call(t, cs, "run_code", map[string]any{"code": "x"}, false); out["result"] != "42" {
		t.Fatalf("state between calls: %v", out)
	}
	// The SDK's client speaks protocol 2026-07-28: each llm_query is a
	// round of the tools/call (an input request, then the call again with
	// the answer), while the run waits in the sandbox.
	out = call(t, cs, "run_code", map[string]any{"code": "[llm_query('capital of France?'), llm_query('capital of Italy?')]"}, false)
	if p := model.asked(); out["result"] != "['Paris', 'Rome']" || len(p) != 2 || p[0] != "capital of France?" {
		t.Fatalf("llm_query through sampling: %v, prompts %q", out, p)
	}
	out = call(t, cs, "run_code", map[string]any{"code": "len(context['items'])", "context": map[string]any{"items": []int{1, 2, 3}}}, false)
	if out["result"] != "3" {
		t.Fatalf("context: %v", out)
	}
	out = call(t, cs, "run_code", map[string]any{"code": "print('before')\n1 / 0"}, true)
	errOut, _ := out["error"].(map[string]any)
	if out["status"] != "failed" || out["stdout"] != "before\n" || errOut["name"] != "ZeroDivisionError" {
		t.Fatalf("a failing run is a tool error with its output: %v", out)
	}
	out = call(t, cs, "run_code", map[string]any{"code": "import time\ntime.sleep(30)", "timeout_seconds": 1}, true)
	if out["status"] != "timed_out" {
		t.Fatalf("timeout: %v", out)
	}
	// Cancelling a call (notifications/cancelled) interrupts the code: the
	// sandbox is free for the next call at once, and the code did not go on.
	cctx, ccancel := context.WithCancel(ctx)
	time.AfterFunc(time.Second, ccancel)
	begin := time.Now()
	if _, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "import time\ntime.sleep(30)\nafter = 1"}}); err == nil {
		t.Fatal("a cancelled call returned a result")
	}
	if out := call(t, cs, "run_code", map[string]any{"code": "'after' in globals()"}, false); out["result"] != "False" || time.Since(begin) > 10*time.Second {
		t.Fatalf("after a cancel: %v (%s)", out, time.Since(begin))
	}
	if v := call(t, cs, "get_variable", map[string]any{"name": "x"}, false); v["json"] != float64(42) || v["type"] != "int" {
		t.Fatalf("get_variable: %v", v)
	}
	if v := call(t, cs, "get_variable", map[string]any{"name": "math"}, false); v["repr"] == nil || v["json"] != nil {
		t.Fatalf("a variable that is not JSON comes as its repr: %v", v)
	}
	if msg := callError(t, cs, "get_variable", map[string]any{"name": "nope"}); !strings.Contains(msg, `no variable named "nope"`) {
		t.Fatalf("missing variable: %s", msg)
	}
	call(t, cs, "write_file", map[string]any{"path": "in/data.txt", "content": "hello"}, false)
	if out := call(t, cs, "run_code", map[string]any{"code": "open('in/data.txt').read().upper()"}, false); out["result"] != "'HELLO'" {
		t.Fatalf("a written file is the code's: %v", out)
	}
	if f := call(t, cs, "read_file", map[string]any{"path": "in/data.txt"}, false); f["content"] != "hello" {
		t.Fatalf("read_file: %v", f)
	}
	list := call(t, cs, "list_files", map[string]any{"path": "in"}, false)
	if entries, _ := list["entries"].([]any); len(entries) != 1 || entries[0].(map[string]any)["name"] != "data.txt" {
		t.Fatalf("list_files: %v", list)
	}
	call(t, cs, "reset", map[string]any{}, false)
	out = call(t, cs, "run_code", map[string]any{"code": "x"}, true)
	if errOut, _ := out["error"].(map[string]any); errOut["name"] != "NameError" {
		t.Fatalf("after reset the variables are gone: %v", out)
	}

	if n := openSessions(t, s, sv.ns); n != 1 {
		t.Fatalf("one MCP session, one Session: %d", n)
	}
	// Ending the MCP session (the host closes stdin) closes its Session.
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	waitFor(t, "the Session of the ended MCP session to be closed", func() bool { return openSessions(t, s, sv.ns) == 0 })
}

// A client on the protocol before 2026-07-28 gets the code's llm_query as a
// sampling request of the server's own, sent while the call is served.
func testOlderProtocol(t *testing.T, sv stdioServer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	model := &capitals{}
	cs := sv.connect(t, ctx, model.options(), &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	defer func() { _ = cs.Close() }()
	if v := cs.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("negotiated %s", v)
	}
	out := call(t, cs, "run_code", map[string]any{"code": "[llm_query('capital of France?'), llm_query('capital of Italy?')]"}, false)
	if p := model.asked(); out["result"] != "['Paris', 'Rome']" || len(p) != 2 {
		t.Fatalf("llm_query through sampling requests: %v, prompts %q", out, p)
	}
}

// The rounds of a run whose code asks the client's model, driven by hand
// (the client's automatic retries off): an answer goes only to the round
// that asked, a round's state works once, and a run the client abandons
// between rounds is interrupted by its next call.
func testRounds(t *testing.T, sv stdioServer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := sv.connect(t, ctx, &mcp.ClientOptions{
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return nil, errors.New("the test answers by hand")
		},
	}, nil)
	defer func() { _ = cs.Close() }()

	code := map[string]any{"code": "print('asking')\nanswer = llm_query('capital of France?')\nanswer.upper()"}
	first, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: code})
	if err != nil {
		t.Fatal(err)
	}
	if !first.NeedsInput() || len(first.InputRequests) != 1 || first.RequestState == "" {
		t.Fatalf("a run that asks the model ends the round with an input request: %+v", first)
	}
	var id string
	for k, ir := range first.InputRequests {
		p, ok := ir.(*mcp.CreateMessageWithToolsParams)
		if !ok || len(p.Messages) != 1 || len(p.Messages[0].Content) != 1 || p.Messages[0].Content[0].(*mcp.TextContent).Text != "capital of France?" {
			t.Fatalf("input request %T %+v", ir, ir)
		}
		id = k
	}
	answer := func(state string, text string) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: code, RequestState: state,
			InputResponses: mcp.InputResponseMap{id: &mcp.CreateMessageResult{Model: "fake", Role: "assistant", Content: &mcp.TextContent{Text: text}}}})
	}
	// Attack: a made-up state reaches no run.
	if res, err := answer("0123456789abcdef0123456789abcdef", "Lyon"); err != nil || !res.IsError || !strings.Contains(text(res), "unknown or over") {
		t.Fatalf("a made-up state: %v %+v", err, res)
	}
	res, err := answer(first.RequestState, "Paris")
	if err != nil || res.IsError || res.NeedsInput() {
		t.Fatalf("the answered round: %v %+v", err, res)
	}
	var out map[string]any
	data, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(data, &out)
	if out["result"] != "'PARIS'" || out["stdout"] != "asking\n" {
		t.Fatalf("the run after its answer: %v", out)
	}
	// Attack: replaying the state of a round already answered changes nothing.
	if res, err := answer(first.RequestState, "Lyon"); err != nil || !res.IsError || !strings.Contains(text(res), "unknown or over") {
		t.Fatalf("a replayed state: %v %+v", err, res)
	}
	if v := call(t, cs, "get_variable", map[string]any{"name": "answer"}, false); v["json"] != "Paris" {
		t.Fatalf("the answer the code got: %v", v)
	}

	// A client that never answers: its next call interrupts the waiting run.
	abandoned, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "late = llm_query('capital of Italy?')"}})
	if err != nil || !abandoned.NeedsInput() {
		t.Fatalf("second question: %v %+v", err, abandoned)
	}
	begin := time.Now()
	if out := call(t, cs, "run_code", map[string]any{"code": "'late' in globals()"}, false); out["result"] != "False" || time.Since(begin) > 20*time.Second {
		t.Fatalf("after an abandoned round: %v (%s)", out, time.Since(begin))
	}
}

func testHTTP(t *testing.T, s *stack.Stack) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A namespace of its own: the Sessions counted below are this test's,
	// whatever the stdio tests' closing clients still leave behind.
	ns, err := s.Namespace(ctx, "mcp-http-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	alice := serviceAccountToken(t, s, ns, "alice", true)
	bob := serviceAccountToken(t, s, ns, "bob", true)
	mallory := serviceAccountToken(t, s, ns, "mallory", false)

	srv := mcpserver.New(mcpserver.Config{Namespace: ns, Pool: "python", Credentials: mcpserver.BearerCredentials(s.Env.Config)})
	defer srv.CloseAll()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() }, nil)
	hs := httptest.NewServer(mcpserver.RequireKubernetesToken(s.Env.Config, h))
	defer func() {
		hs.CloseClientConnections() // the clients' event streams; Close waits for them otherwise
		hs.Close()
	}()

	// Without a token: refused before any MCP handling.
	resp, err := http.Post(hs.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no token: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	// Attack: a token kube-apiserver does not accept is refused the same way.
	forged, _ := http.NewRequest(http.MethodPost, hs.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	forged.Header.Set("Authorization", "Bearer "+strings.Repeat("x", 40))
	forged.Header.Set("Content-Type", "application/json")
	if resp, err = http.DefaultClient.Do(forged); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a made-up token: %d", resp.StatusCode)
	}

	connect := func(token *atomic.Value) *mcp.ClientSession {
		hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token.Load().(string))
			return http.DefaultTransport.RoundTrip(r)
		})}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: hc}, nil)
		if err != nil {
			t.Fatalf("connect over HTTP: %v", err)
		}
		return cs
	}
	tokenOf := func(tok string) *atomic.Value { v := &atomic.Value{}; v.Store(tok); return v }

	aliceToken := tokenOf(alice)
	a1 := connect(aliceToken)
	a2 := connect(tokenOf(alice))
	call(t, a1, "run_code", map[string]any{"code": "secret = 'a1'"}, false)
	out := call(t, a2, "run_code", map[string]any{"code": "secret"}, true)
	if errOut, _ := out["error"].(map[string]any); errOut["name"] != "NameError" {
		t.Fatalf("each MCP session has a sandbox of its own: %v", out)
	}
	if out := call(t, a1, "run_code", map[string]any{"code": "secret"}, false); out["result"] != "'a1'" {
		t.Fatalf("state of a1: %v", out)
	}
	// Without sampling, llm_query raises in the code, saying why.
	out = call(t, a1, "run_code", map[string]any{"code": "llm_query('x')"}, true)
	if errOut, _ := out["error"].(map[string]any); !strings.Contains(errOut["value"].(string), "does not support sampling") {
		t.Fatalf("llm_query without sampling: %v", out)
	}

	// Attack: a caller whose token RBAC gives no Session rights gets nothing.
	m := connect(tokenOf(mallory))
	if msg := callError(t, m, "run_code", map[string]any{"code": "1"}); !strings.Contains(msg, "forbidden") {
		t.Fatalf("mallory: %s", msg)
	}
	// Attack: another caller with rights of its own, on a1's MCP session
	// (its session ID), reaches neither a1's tools nor its sandbox, nor can
	// it end the session: the HTTP handler answers 403 (session user
	// mismatch) before any MCP handling.
	for _, method := range []string{http.MethodPost, http.MethodDelete} {
		r, _ := http.NewRequest(method, hs.URL, strings.NewReader(
			`{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"secret"}}}`))
		r.Header.Set("Authorization", "Bearer "+bob)
		r.Header.Set("Mcp-Session-Id", a1.ID())
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Mcp-Protocol-Version", a1.InitializeResult().ProtocolVersion)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("bob's %s on alice's MCP session: %d", method, resp.StatusCode)
		}
	}
	// A second token of the same user (tokens rotate) is the same caller.
	aliceToken.Store(serviceAccountToken(t, s, ns, "alice", false))
	if out := call(t, a1, "run_code", map[string]any{"code": "secret"}, false); out["result"] != "'a1'" {
		t.Fatalf("alice with a new token: %v", out)
	}
	aliceToken.Store(alice)

	count := func() int { return openSessions(t, s, ns) }
	if n := count(); n != 2 {
		t.Fatalf("two MCP sessions with sandboxes, two Sessions: %d", n)
	}
	_ = a1.Close() // DELETE of the MCP session
	waitFor(t, "a1's Session to be closed", func() bool { return count() == 1 })
	_ = a2.Close()
	_ = m.Close()
	waitFor(t, "a2's Session to be closed", func() bool { return count() == 0 })
}

// A command line tool that initializes, calls run_code once and exits
// without DELETE (as many do, and as the TypeScript SDK's close() leaves an
// MCP session) must not keep a warm pod past the idle timeout: after a
// hundred of them, a few at a time, no Session is open and no pod held once
// it has passed, and their MCP sessions are gone too. DELETE closes the
// Session at once. A client that keeps its MCP session (pings) but calls no
// tool has its sandbox closed, is told so by its next call, and gets a fresh
// sandbox with the call after.
func testOneShotHTTP(t *testing.T, s *stack.Stack) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns, err := s.Namespace(ctx, "mcp-oneshot-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 4); err != nil {
		t.Fatal(err)
	}
	token := serviceAccountToken(t, s, ns, "cli", true)
	// serve runs the MCP server over HTTP as cmd/warmpool-mcp does, with
	// idle as both --idle-timeout and the SDK's session timeout.
	serve := func(idle time.Duration) string {
		srv := mcpserver.New(mcpserver.Config{Namespace: ns, Pool: "python", IdleTimeout: idle,
			Credentials: mcpserver.BearerCredentials(s.Env.Config)})
		t.Cleanup(srv.CloseAll)
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() },
			&mcp.StreamableHTTPOptions{SessionTimeout: idle})
		hs := httptest.NewServer(mcpserver.RequireKubernetesToken(s.Env.Config, h))
		t.Cleanup(func() {
			hs.CloseClientConnections()
			hs.Close()
		})
		return hs.URL
	}
	open := func() int { return openSessions(t, s, ns) }
	// heldPods names the pool's pods that a Session or an Execution holds.
	heldPods := func() []string {
		pods := &corev1.PodList{}
		if err := s.Env.Client.List(ctx, pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && (lease.Session(p) != "" || lease.ClaimedBy(p) != "") {
				names = append(names, fmt.Sprintf("%s (session %q, claimed by %q, %s)", p.Name, lease.Session(p), lease.ClaimedBy(p), p.Status.Phase))
			}
		}
		return names
	}
	held := func() int { return len(heldPods()) }
	settled := func(within time.Duration) error {
		deadline := time.Now().Add(within)
		for {
			o, h := open(), held()
			if o == 0 && h == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d Sessions open, %d pods held: %s", o, h, strings.Join(heldPods(), ", "))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	const idle = 1500 * time.Millisecond
	url := serve(idle)
	const clients, atOnce = 100, 4
	ids := make([]string, clients)
	var wg sync.WaitGroup
	next := atomic.Int32{}
	begin := time.Now()
	for range atOnce {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < clients && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				c := &cli{url: url, token: token}
				if err := c.initialize(ctx); err != nil {
					t.Errorf("client %d: %v", i, err)
					cancel()
					return
				}
				out, err := c.runCode(ctx, fmt.Sprintf("%d * %d", i, i))
				if err != nil || out != fmt.Sprint(i*i) {
					t.Errorf("client %d: run_code: %q, %v", i, out, err)
					cancel()
					return
				}
				ids[i] = c.session
				c.exit() // no DELETE
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	last := time.Now()
	t.Logf("%d one-shot clients, %d at a time, in %s; %d Sessions open, %d pods held as the last left",
		clients, atOnce, last.Sub(begin).Round(time.Millisecond), open(), held())
	time.Sleep(idle)
	// Past the idle timeout, what is left is the Sessions' deletes and the
	// manager freeing their pods.
	if err := settled(10 * time.Second); err != nil {
		t.Fatalf("%s after the last one-shot client left without DELETE (idle timeout %s): %v", time.Since(last).Round(time.Millisecond), idle, err)
	}
	t.Logf("no Session open and no pod held %s after the last client left", time.Since(last).Round(time.Millisecond))
	// The MCP sessions ended too (the SDK's session timeout), not only their sandboxes.
	stale := &cli{url: url, token: token, session: ids[0], version: "2025-11-25"}
	if _, err := stale.runCode(ctx, "1"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a call on the MCP session of a client gone without DELETE: %v, want 404 (session not found)", err)
	}

	// Control: DELETE closes the Session at once, long before a 10-minute idle timeout.
	c := &cli{url: serve(10 * time.Minute), token: token}
	if err := c.initialize(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := c.runCode(ctx, "'kept'"); err != nil || out != "'kept'" {
		t.Fatalf("run_code: %q, %v", out, err)
	}
	if o, h := open(), held(); o != 1 || h != 1 {
		t.Fatalf("before DELETE: %d Sessions open, %d pods held, want 1 and 1", o, h)
	}
	deleted := time.Now()
	if err := c.delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := settled(5 * time.Second); err != nil {
		t.Fatalf("after DELETE: %v", err)
	}
	t.Logf("DELETE: no Session open and no pod held %s after it", time.Since(deleted).Round(time.Millisecond))

	// A client that stays (pings keep its MCP session) but calls no tool.
	hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultTransport.RoundTrip(r)
	})}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	defer func() { _ = cs.Close() }()
	call(t, cs, "run_code", map[string]any{"code": "x = 1"}, false)
	pinging, stopPings := context.WithCancel(ctx)
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		for pinging.Err() == nil {
			if err := cs.Ping(pinging, nil); err != nil && pinging.Err() == nil {
				t.Errorf("ping: %v", err)
				return
			}
			time.Sleep(idle / 5)
		}
	}()
	err = settled(idle + 10*time.Second)
	stopPings()
	<-pinged
	if err != nil {
		t.Fatalf("a client that calls no tool for the idle timeout: %v", err)
	}
	if msg := callError(t, cs, "run_code", map[string]any{"code": "x"}); !strings.Contains(msg, "sandbox was closed after 1.5s without a tool call") {
		t.Fatalf("the call after the sandbox expired: %s", msg)
	}
	out := call(t, cs, "run_code", map[string]any{"code": "x"}, true)
	if errOut, _ := out["error"].(map[string]any); errOut["name"] != "NameError" {
		t.Fatalf("the call after that runs in a fresh sandbox: %v", out)
	}
}

// cli is an MCP client as a one-shot command line tool is: plain HTTP
// requests on protocol 2025-11-25, no event stream of its own, and an exit
// that sends no DELETE.
type cli struct {
	url, token       string
	session, version string
	hc               *http.Client
}

func (c *cli) client() *http.Client {
	if c.hc == nil {
		c.hc = &http.Client{Transport: &http.Transport{}} // its own connections, gone when it exits
	}
	return c.hc
}

// exit drops the client's connections, as a process that ends does.
func (c *cli) exit() { c.client().CloseIdleConnections() }

func (c *cli) send(ctx context.Context, method string, body any) (*http.Response, error) {
	var r *http.Request
	var err error
	if body == nil {
		r, err = http.NewRequestWithContext(ctx, method, c.url, nil)
	} else {
		data, merr := json.Marshal(body)
		if merr != nil {
			return nil, merr
		}
		r, err = http.NewRequestWithContext(ctx, method, c.url, strings.NewReader(string(data)))
		r.Header.Set("Content-Type", "application/json")
	}
	if err != nil {
		return nil, err
	}
	r.Header.Set("Authorization", "Bearer "+c.token)
	r.Header.Set("Accept", "application/json, text/event-stream")
	if c.session != "" {
		r.Header.Set("Mcp-Session-Id", c.session)
		r.Header.Set("Mcp-Protocol-Version", c.version)
	}
	return c.client().Do(r)
}

// call sends a JSON-RPC request and returns its result, read from a JSON
// body or from the response's event stream.
func (c *cli) call(ctx context.Context, id int, method string, params any) (*http.Response, json.RawMessage, error) {
	resp, err := c.send(ctx, http.MethodPost, map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", method, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return resp, nil, fmt.Errorf("%s: HTTP %d", method, resp.StatusCode)
	}
	var msg struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			var ok bool
			if line, ok = strings.CutPrefix(line, "data:"); !ok {
				continue
			}
		}
		msg.ID, msg.Result, msg.Error = 0, nil, nil
		if json.Unmarshal([]byte(line), &msg) != nil || msg.ID != id {
			continue // not the answer: a notification, or an event's other lines
		}
		if msg.Error != nil {
			return resp, nil, fmt.Errorf("%s: %s", method, msg.Error.Message)
		}
		return resp, msg.Result, nil
	}
	return resp, nil, fmt.Errorf("%s: no answer (%v)", method, sc.Err())
}

func (c *cli) initialize(ctx context.Context) error {
	resp, res, err := c.call(ctx, 1, "initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "one-shot-cli", "version": "1"}})
	if err != nil {
		return err
	}
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(res, &init); err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	c.session, c.version = resp.Header.Get("Mcp-Session-Id"), init.ProtocolVersion
	if c.session == "" {
		return errors.New("initialize: no Mcp-Session-Id")
	}
	nresp, err := c.send(ctx, http.MethodPost, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	if err != nil {
		return fmt.Errorf("notifications/initialized: %w", err)
	}
	_ = nresp.Body.Close()
	if nresp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("notifications/initialized: HTTP %d", nresp.StatusCode)
	}
	return nil
}

// runCode calls run_code and returns the result's repr.
func (c *cli) runCode(ctx context.Context, code string) (string, error) {
	_, res, err := c.call(ctx, 2, "tools/call", map[string]any{"name": "run_code", "arguments": map[string]any{"code": code}})
	if err != nil {
		return "", err
	}
	var out struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			Result string `json:"result"`
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal(res, &out); err != nil {
		return "", fmt.Errorf("run_code: %w", err)
	}
	if out.IsError {
		return "", fmt.Errorf("run_code: tool error: %s", res)
	}
	return out.StructuredContent.Result, nil
}

// delete ends the MCP session, as a client that exits properly does.
func (c *cli) delete(ctx context.Context) error {
	resp, err := c.send(ctx, http.MethodDelete, nil)
	if err != nil {
		return fmt.Errorf("DELETE: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("DELETE: HTTP %d", resp.StatusCode)
	}
	return nil
}

// openSessions counts the Sessions of ns that have not ended: neither
// deleted nor Closed or Lost.
func openSessions(t *testing.T, s *stack.Stack, ns string) int {
	t.Helper()
	list := &sandboxv1alpha1.SessionList{}
	if err := s.Env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ses := range list.Items {
		if ses.DeletionTimestamp == nil && !ses.Status.Phase.IsFinished() {
			n++
		}
	}
	return n
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// serviceAccountToken returns a new token of a ServiceAccount of ns (made
// when missing), bound to the session editor role when editor.
func serviceAccountToken(t *testing.T, s *stack.Stack, ns, name string, editor bool) string {
	ctx := context.Background()
	c := s.Env.Client
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if editor {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-sessions"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "session-editor-role"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
		if err := c.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := kubernetes.NewForConfig(s.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s: %v", name, err)
	}
	return tr.Status.Token
}

// call calls a tool and returns its structured output; isError says
// whether the call is expected to be a tool error (a failed run).
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, isError bool) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError != isError {
		t.Fatalf("%s: isError %v, want %v: %s", name, res.IsError, isError, text(res))
	}
	var out map[string]any
	data, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(data, &out); err != nil || out == nil {
		t.Fatalf("%s: no structured output (%v): %s", name, err, text(res))
	}
	return out
}

// callError calls a tool that must fail and returns its message.
func callError(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return err.Error()
	}
	if !res.IsError {
		t.Fatalf("%s: succeeded, want an error: %s", name, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
