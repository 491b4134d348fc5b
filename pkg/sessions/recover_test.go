package sessions

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A run whose answer was lost is attached to again when the first attach
// lands on the data-plane replica that went away (502/503 from the API
// server's proxy, before any stream): the code is never sent anew, its
// result arrives.
func TestRecoverRunAsksAgainWhenTheAttachHitsAGoneReplica(t *testing.T) {
	stream, err := os.ReadFile("../protocol/testdata/output-and-result.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	var attaches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			_, _ = w.Write([]byte(`{"running": true}`))
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			if attaches.Add(1) == 1 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"error trying to reach service: dial tcp 10.244.0.6:9443: connect: connection refused","code":503}`))
				return
			}
			_, _ = w.Write(stream)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	var out strings.Builder
	res, err := s.recoverRun(context.Background(), RunRequest{ExecRequest: ExecRequest{ID: "run-1", Code: "x"}},
		Handlers{OnStdout: func(d string) { out.WriteString(d) }})
	if err != nil {
		t.Fatalf("recoverRun: %v", err)
	}
	if res.Result == nil || *res.Result != "42" || out.String() != "out\n" {
		t.Errorf("result %+v, stdout %q: want the run's, streamed once", res, out.String())
	}
	if n := attaches.Load(); n != 2 {
		t.Errorf("%d attaches, want 2 (the refused one, then the one that streamed)", n)
	}
}

// A question the API server's proxy sends to the replica that went away
// hangs (its address answers nothing): it is given up after askTimeout and
// asked again, and the run's result still arrives, the code never sent anew.
func TestRecoverRunAsksAgainWhenAQuestionHangs(t *testing.T) {
	defer func(d time.Duration) { askTimeout = d }(askTimeout)
	askTimeout = 200 * time.Millisecond
	var asks, execs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			if asks.Add(1) == 1 {
				<-r.Context().Done() // the dead endpoint: nothing, ever
				return
			}
			_, _ = w.Write([]byte(`{"id":"run-1","result":{"id":"run-1","status":"succeeded","stdout":"","stderr":"","result":"1"}}`))
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			execs.Add(1)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	start := time.Now()
	res, err := s.recoverRun(context.Background(), RunRequest{ExecRequest: ExecRequest{ID: "run-1", Code: "x"}}, Handlers{})
	if err != nil {
		t.Fatalf("recoverRun: %v", err)
	}
	if res.Result == nil || *res.Result != "1" {
		t.Errorf("result %+v, want the run's", res)
	}
	if asks.Load() != 2 || execs.Load() != 0 {
		t.Errorf("%d questions and %d execs, want 2 and none", asks.Load(), execs.Load())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("recovered after %s: the hung question was not given up", d)
	}
}
