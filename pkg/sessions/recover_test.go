package sessions

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
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
