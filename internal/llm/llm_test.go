package llm

import (
	"context"
	"encoding/json"
	"github.com/warmpool/warmpool/internal/metrics"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warmpool/warmpool/internal/testing/fakellm"
	"github.com/warmpool/warmpool/pkg/protocol"
)

func fake(t *testing.T, respond func(w http.ResponseWriter, r fakellm.Request)) *fakellm.Server {
	s, err := fakellm.Start("")
	if err != nil {
		t.Fatal(err)
	}
	s.Respond = respond
	t.Cleanup(s.Close)
	return s
}

func call(method, params string) protocol.BridgeCall {
	return protocol.BridgeCall{ID: "1", Method: method, Params: json.RawMessage(params)}
}

func TestAnswererAsksTheEndpointWithTheKey(t *testing.T) {
	srv := fake(t, nil)
	ep := Endpoint{Name: "t1", URL: srv.Endpoint(), Model: "m", APIKey: "sk-test", MaxTokens: 7, Timeout: 5 * time.Second}
	a := NewClient().Answerer(ep)
	got := a(context.Background(), call("llm_query", `{"prompt":"hi"}`))
	if got.Error != "" || string(got.Result) != `"m says: hi"` {
		t.Fatalf("answer: %+v", got)
	}
	if req := srv.Requests()[0]; req != (fakellm.Request{Model: "m", Prompt: "hi", MaxTokens: 7, Authorization: "Bearer sk-test"}) {
		t.Fatalf("request: %+v", req)
	}
	got = a(context.Background(), call("rlm_query", `{"task":"sum","context":[1,2]}`))
	if string(got.Result) != `"m says: sum\n\nContext:\n[1,2]"` {
		t.Fatalf("rlm_query: %+v", got)
	}
	if v := testutil.ToFloat64(metrics.LLMCalls.WithLabelValues("t1", "ok")); v != 2 {
		t.Fatalf("calls counted: %v", v)
	}
	// usage: completion tokens are len("m says: hi") and len("m says: sum...") in the fake.
	if v := testutil.ToFloat64(metrics.LLMTokens.WithLabelValues("t1", "prompt")); v != float64(len("hi")+len("sum\n\nContext:\n[1,2]")) {
		t.Fatalf("prompt tokens counted: %v", v)
	}
}

func TestAnswererHoldsTheRunToItsLimits(t *testing.T) {
	srv := fake(t, nil)
	a := NewClient().Answerer(Endpoint{Name: "t2", URL: srv.Endpoint(), Model: "m", MaxCallsPerRun: 2, MaxPromptBytes: 10})
	if got := a(context.Background(), call("llm_query", `{"prompt":"this prompt is too long"}`)); !strings.Contains(got.Error, "over the 10 bytes") {
		t.Fatalf("long prompt: %+v", got)
	}
	if got := a(context.Background(), call("llm_query", `{"prompt":"ok"}`)); got.Error != "" {
		t.Fatalf("second call: %+v", got)
	}
	if got := a(context.Background(), call("llm_query", `{"prompt":"ok"}`)); !strings.Contains(got.Error, "limit of 2 model calls per run") {
		t.Fatalf("third call: %+v", got)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Fatalf("refused calls must not reach the endpoint: %d requests", n)
	}
	if v := testutil.ToFloat64(metrics.LLMCalls.WithLabelValues("t2", "refused")); v != 2 {
		t.Fatalf("refusals counted: %v", v)
	}
}

func TestEndpointErrorsReachTheCodeClearly(t *testing.T) {
	limited := fake(t, func(w http.ResponseWriter, _ fakellm.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"message":"rate limited, retry later"}}`))
	})
	got := NewClient().Answerer(Endpoint{Name: "t3", URL: limited.Endpoint(), Model: "m", APIKey: "sk-secret"})(
		context.Background(), call("llm_query", `{"prompt":"x"}`))
	if !strings.Contains(got.Error, "ModelEndpoint t3: answered 429 Too Many Requests: rate limited, retry later") {
		t.Fatalf("error: %q", got.Error)
	}
	if strings.Contains(got.Error, "sk-secret") {
		t.Fatal("the key must not reach the code")
	}
	if v := testutil.ToFloat64(metrics.LLMCalls.WithLabelValues("t3", "error")); v != 1 {
		t.Fatalf("errors counted: %v", v)
	}

	slow := fake(t, func(http.ResponseWriter, fakellm.Request) { time.Sleep(2 * time.Second) })
	got = NewClient().Answerer(Endpoint{Name: "t4", URL: slow.Endpoint(), Model: "m", Timeout: 200 * time.Millisecond})(
		context.Background(), call("llm_query", `{"prompt":"x"}`))
	if got.Error != "ModelEndpoint t4 did not answer within 200ms" {
		t.Fatalf("timeout: %q", got.Error)
	}

	junk := fake(t, func(w http.ResponseWriter, _ fakellm.Request) { _, _ = w.Write([]byte("<html>")) })
	got = NewClient().Answerer(Endpoint{Name: "t5", URL: junk.Endpoint(), Model: "m"})(context.Background(), call("llm_query", `{"prompt":"x"}`))
	if !strings.Contains(got.Error, "not a chat completion") {
		t.Fatalf("junk: %q", got.Error)
	}
	if got := NewClient().Answerer(Endpoint{Name: "t6", URL: junk.Endpoint()})(context.Background(), call("shell", `{}`)); !strings.Contains(got.Error, "not a model call") {
		t.Fatalf("other method: %q", got.Error)
	}
}

// The batched forms are one model call per item, answered in order, each
// counted against the run's limit.
func TestAnswererAnswersBatchedQueries(t *testing.T) {
	srv := fake(t, nil)
	a := NewClient().Answerer(Endpoint{Name: "t-batch", URL: srv.Endpoint(), Model: "m", MaxCallsPerRun: 5})
	got := a(context.Background(), call("llm_query_batched", `{"prompts":["a","b","c"]}`))
	if got.Error != "" || string(got.Result) != `["m says: a","m says: b","m says: c"]` {
		t.Fatalf("llm_query_batched: %+v", got)
	}
	got = a(context.Background(), call("rlm_query_batched", `{"tasks":[{"task":"t1","context":"ctx"},{"task":"t2"}]}`))
	if got.Error != "" || string(got.Result) != `["m says: t1\n\nContext:\nctx","m says: t2"]` {
		t.Fatalf("rlm_query_batched: %+v", got)
	}
	// 5 calls made; a batch of 2 more goes past the limit and is refused whole.
	if got := a(context.Background(), call("llm_query_batched", `{"prompts":["d","e"]}`)); !strings.Contains(got.Error, "limit of 5 model calls") {
		t.Fatalf("over the limit: %+v", got)
	}
	if n := len(srv.Requests()); n != 5 {
		t.Fatalf("the endpoint was asked %d times, want 5", n)
	}
}
