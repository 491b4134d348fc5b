package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// updateGolden rewrites pkg/protocol/testdata from what the agent streams:
// go test ./internal/agent/server -run TestGoldenStreams -update
var updateGolden = flag.Bool("update", false, "rewrite the golden NDJSON streams of pkg/protocol/testdata")

// goldenRuns are the streams every client is tested against: the shapes of
// a run's events a client must read.
var goldenRuns = []struct {
	name string
	req  protocol.ExecuteRequest
	// answer, when set, answers the run's bridge calls.
	answer string
}{
	{name: "output-and-result", req: protocol.ExecuteRequest{Code: "print('out')\n6 * 7"}},
	{name: "stderr", req: protocol.ExecuteRequest{Code: "import sys\nprint('err', file=sys.stderr)"}},
	{name: "bridge", req: protocol.ExecuteRequest{Code: "a = llm_query('2+2?')\nprint(a)\na", Bridge: true}, answer: `"four"`},
	{name: "error", req: protocol.ExecuteRequest{Code: "1 / 0"}},
	{name: "final", req: protocol.ExecuteRequest{Code: "FINAL('the answer')"}},
	{name: "timed-out", req: protocol.ExecuteRequest{Code: "print('started', flush=True)\nimport time\ntime.sleep(30)", TimeoutMillis: 300}},
	{name: "killed", req: protocol.ExecuteRequest{Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" +
		"print('ignoring', flush=True)\ntime.sleep(30)", TimeoutMillis: 200, GraceMillis: 200}},
	{name: "interpreter-restarted", req: protocol.ExecuteRequest{Code: "1", Interpreter: "an-interpreter-that-is-gone"}},
	{name: "shell", req: protocol.ExecuteRequest{Code: "echo hi; exit 3", Language: protocol.LanguageShell}},
}

// normalize replaces what differs from run to run (times, IDs, tags) with
// fixed values, keeping every field's presence and type.
func normalize(t *testing.T, line []byte) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(line, &ev); err != nil {
		t.Fatalf("event %q: %v", line, err)
	}
	if call, ok := ev["call"].(map[string]any); ok {
		call["id"] = "call-1"
	}
	if res, ok := ev["result"].(map[string]any); ok {
		res["id"] = "run-1"
		res["startedAt"], res["finishedAt"], res["durationMillis"] = "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.0015Z", 1.5
		if _, ok := res["interpreter"]; ok {
			res["interpreter"] = "interpreter-1"
		}
		if e, ok := res["error"].(map[string]any); ok {
			// Frames and carets differ between Python versions: a traceback
			// keeps its first and last lines.
			if tb, ok := e["traceback"].(string); ok && tb != "" {
				lines := strings.Split(strings.TrimSuffix(tb, "\n"), "\n")
				e["traceback"] = lines[0] + "\n  ...\n" + lines[len(lines)-1] + "\n"
			}
		}
	}
	b, _ := json.Marshal(ev)
	return b
}

func TestGoldenStreams(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "pkg", "protocol", "testdata")
	for _, g := range goldenRuns {
		t.Run(g.name, func(t *testing.T) {
			a := startAgent(t, 1)
			req := g.req
			req.ID, req.Stream = "golden-"+g.name, true
			body, _ := json.Marshal(req)
			hreq, _ := http.NewRequest(http.MethodPost, a.url+protocol.PathExecute, bytes.NewReader(body))
			hreq.Header.Set("Authorization", "Bearer "+token)
			hreq.Header.Set("Accept", protocol.ContentTypeNDJSON)
			resp, err := http.DefaultClient.Do(hreq)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			var got bytes.Buffer
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				got.Write(normalize(t, sc.Bytes()))
				got.WriteByte('\n')
				var ev protocol.Event
				_ = json.Unmarshal(sc.Bytes(), &ev)
				if ev.Type == protocol.EventBridge && g.answer != "" {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err := a.c.AnswerBridge(ctx, req.ID, ev.Call.ID, protocol.BridgeAnswer{Result: json.RawMessage(g.answer)})
					cancel()
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			path := filepath.Join(dir, g.name+".ndjson")
			if *updateGolden {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("the agent's stream changed from the wire contract's golden %s:\n got: %s\nwant: %s\n"+
					"(a change on purpose: go test ./internal/agent/server -run TestGoldenStreams -update, and update every client)",
					path, got.String(), want)
			}
		})
	}
}
