package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// The client against the wire contract's golden streams
// (pkg/protocol/testdata): what the agent streams, as the data plane relays
// it. The data plane here is a server that answers every run with a golden
// stream and takes bridge answers.
func runGolden(t *testing.T, name string, h Handlers) (*Result, []BridgeAnswer, error) {
	t.Helper()
	stream, err := os.ReadFile(filepath.Join("..", "protocol", "testdata", name+".ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	var answers []BridgeAnswer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/exec"):
			w.Header().Set("Content-Type", protocol.ContentTypeNDJSON)
			_, _ = w.Write(stream)
		case strings.HasSuffix(r.URL.Path, "/bridge"):
			var a BridgeAnswer
			if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
				t.Errorf("bridge answer: %v", err)
			}
			answers = append(answers, a)
			_, _ = w.Write([]byte(`{"delivered":true}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := (&Client{}).WithDataPlane(srv.URL, srv.Client())
	res, err := c.Open("ns", "s").RunStream(context.Background(), ExecRequest{Code: "the stream is the golden one"}, h)
	return res, answers, err
}

func TestGoldenStreamsDecodeStrictly(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "protocol", "testdata", "*.ndjson"))
	if len(files) < 9 {
		t.Fatalf("golden streams: %v", files)
	}
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields() // a field the agent sends and no client type knows
			var ev Event
			if err := dec.Decode(&ev); err != nil {
				t.Errorf("%s: %v: %s", filepath.Base(f), err, line)
			}
			switch ev.Type {
			case EventStdout, EventStderr, EventBridge, EventResult:
			default:
				t.Errorf("%s: an event kind no client knows: %q", filepath.Base(f), ev.Type)
			}
		}
	}
}

func TestGoldenStreams(t *testing.T) {
	var out, errOut strings.Builder
	res, _, err := runGolden(t, "output-and-result", Handlers{OnStdout: func(d string) { out.WriteString(d) }})
	if err != nil || res.Status != StatusSucceeded || *res.Result != "42" || out.String() != "out\n" || res.Stdout != "out\n" {
		t.Errorf("output-and-result: %+v %v %q", res, err, out.String())
	}
	res, _, err = runGolden(t, "stderr", Handlers{OnStderr: func(d string) { errOut.WriteString(d) }})
	if err != nil || res.Stderr != "err\n" || errOut.String() != "err\n" {
		t.Errorf("stderr: %+v %v", res, err)
	}
	res, answers, err := runGolden(t, "bridge", Handlers{OnBridge: func(_ context.Context, call BridgeCall) (json.RawMessage, error) {
		if call.Method != "llm_query" || string(call.Params) != `{"prompt":"2+2?"}` {
			t.Errorf("bridge call %+v", call)
		}
		return json.RawMessage(`"four"`), nil
	}})
	if err != nil || *res.Result != "'four'" || len(answers) != 1 || answers[0].Call != "call-1" || string(answers[0].Result) != `"four"` {
		t.Errorf("bridge: %+v %v %+v", res, err, answers)
	}
	for name, want := range map[string]struct {
		status    protocol.Status
		errType   string
		stateLost bool
	}{
		"error":                 {StatusFailed, "ZeroDivisionError", false},
		"timed-out":             {StatusTimedOut, "KeyboardInterrupt", false},
		"killed":                {StatusTimedOut, protocol.ErrorInterpreterKilled, true},
		"interpreter-restarted": {StatusFailed, protocol.ErrorInterpreterRestarted, true},
		"shell":                 {StatusFailed, "NonZeroExit", false},
	} {
		res, _, err := runGolden(t, name, Handlers{})
		if err != nil || res.Status != want.status || res.Error == nil || res.Error.Type != want.errType || res.StateLost != want.stateLost {
			t.Errorf("%s: %+v %+v %v", name, res, res.Error, err)
		}
	}
	res, _, err = runGolden(t, "final", Handlers{})
	if err != nil || !res.Final || *res.Result != "the answer" {
		t.Errorf("final: %+v %v", res, err)
	}
}
