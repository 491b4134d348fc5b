package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"net"
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

// A Session's streamed run whose stream is cut before its result (the
// replica serving it stopped) is picked up by its ID: an attach through
// another replica gets its result (an agent streams live output only to the
// caller that started the run), the output the caller had not seen is
// handed on from it, and the code is sent once.
func TestRunStreamPicksUpACutStreamByItsID(t *testing.T) {
	var sends, attaches atomic.Int32
	var runID atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			_, _ = w.Write([]byte(`{"running": true}`))
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			var req ExecRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if sends.Add(1) == 1 {
				runID.Store(req.ID)
				_, _ = w.Write([]byte(`{"type":"stdout","data":"before\n"}` + "\n" + `{"type":"std`)) // cut mid-line
				return
			}
			if req.ID != runID.Load() {
				t.Errorf("attached with ID %q, want the run's %q", req.ID, runID.Load())
			}
			attaches.Add(1)
			_, _ = w.Write([]byte(`{"type":"result","result":{"id":"x","status":"succeeded","stdout":"before\nafter\n","stderr":"","result":"2"}}` + "\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	var out strings.Builder
	res, err := s.RunStream(context.Background(), ExecRequest{Code: "x"}, Handlers{OnStdout: func(d string) { out.WriteString(d) }})
	if err != nil {
		t.Fatalf("RunStream: %v", err)
	}
	if res.Result == nil || *res.Result != "2" || out.String() != "before\nafter\n" {
		t.Errorf("result %+v, stdout %q", res, out.String())
	}
	if attaches.Load() != 1 || sends.Load() != 2 {
		t.Errorf("%d requests, %d of them attaches: want the run sent once, attached once", sends.Load(), attaches.Load())
	}
}

// A run that never reached the Session's agent (the replica stopped before
// it forwarded it: the agent does not know its ID) is sent again, with the
// same ID; a run whose result is stored is not sent again.
func TestRunSendsAgainOnlyWhatNeverArrived(t *testing.T) {
	defer func(d time.Duration) { askTimeout = d }(askTimeout)
	askTimeout = 200 * time.Millisecond
	var execs, asks atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			asks.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"no run","reason":"NotFound","code":404}`))
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			if execs.Add(1) == 1 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadGateway)
				_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"error trying to reach service","code":502}`))
				return
			}
			_, _ = w.Write([]byte(`{"id":"x","status":"succeeded","stdout":"","stderr":"","result":"7"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	res, err := s.Run(context.Background(), ExecRequest{Code: "7"})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Result == nil || *res.Result != "7" || execs.Load() != 2 || asks.Load() == 0 {
		t.Errorf("result %+v after %d sends and %d questions: want 7 after the agent said it never had the run", res, execs.Load(), asks.Load())
	}
}

// A run refused with 503 (a replica not ready, or none the API server could
// reach) did not run: it is sent again after a pause, without asking about
// it, and the refusal is returned once the resends are spent.
func TestRunSendsAgainWhatWasRefusedUnready(t *testing.T) {
	var execs, asks atomic.Int32
	ready := int32(3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			asks.Add(1)
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			if execs.Add(1) < ready {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"this manager replica has not loaded the agent signing keys yet","reason":"ServiceUnavailable","code":503}`))
				return
			}
			_, _ = w.Write([]byte(`{"id":"x","status":"succeeded","stdout":"","stderr":"","result":"5"}`))
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	res, err := s.Run(context.Background(), ExecRequest{Code: "5"})
	if err != nil || res.Result == nil || *res.Result != "5" || execs.Load() != 3 || asks.Load() != 0 {
		t.Fatalf("result %+v, err %v after %d sends and %d questions: want 5 on the third send, nothing asked", res, err, execs.Load(), asks.Load())
	}
	execs.Store(0)
	ready = 100
	if _, err := s.Run(context.Background(), ExecRequest{Code: "5"}); !IsStatus(err, http.StatusServiceUnavailable) || execs.Load() != maxResends+1 {
		t.Fatalf("after %d sends: %v, want the 503 after %d", execs.Load(), err, maxResends+1)
	}
}

// A run whose connection could not even be made was never sent: it is tried
// again a few times, and the dial error returned, nothing asked about it.
func TestRunReturnsADialErrorWithoutAskingAboutTheRun(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there now
	s := (&Client{}).WithDataPlane(addr, http.DefaultClient).Open("ns", "s")
	start := time.Now()
	_, err := s.Run(context.Background(), ExecRequest{Code: "1"})
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("err %v, want the dial error", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("took %s: it asked about a run that was never sent", took)
	}
}

// A run sent again with its ID attaches when it had reached the agent after
// all (a 503 from a replica that went away after forwarding it): the answer
// is then the run's result without its stream. Its output still reaches the
// caller's handlers, once (seen on kind: a step's right result, nothing streamed).
func TestRunStreamHandsOnTheOutputOfARunItAttachedToWhenSentAgain(t *testing.T) {
	var execs atomic.Int32
	var whole atomic.Bool // answer with the whole stream, the control
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/sessions/s/exec") {
			http.NotFound(w, r)
			return
		}
		result := `{"type":"result","result":{"id":"x","status":"succeeded","stdout":"step 1\n","stderr":"","result":"1"}}` + "\n"
		switch {
		case whole.Load():
			_, _ = w.Write([]byte(`{"type":"stdout","data":"step 1\n"}` + "\n" + result))
		case execs.Add(1) == 1:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"error trying to reach service: EOF","reason":"ServiceUnavailable","code":503}`))
		default:
			_, _ = w.Write([]byte(result)) // attached: the result alone
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	var out strings.Builder
	res, err := s.RunStream(context.Background(), ExecRequest{Code: "x"}, Handlers{OnStdout: func(d string) { out.WriteString(d) }})
	if err != nil || res.Result == nil || *res.Result != "1" {
		t.Fatalf("RunStream: %+v, %v", res, err)
	}
	if out.String() != "step 1\n" || execs.Load() != 2 {
		t.Errorf("streamed %q after %d sends, want the run's output once after 2", out.String(), execs.Load())
	}

	whole.Store(true)
	out.Reset()
	if _, err := s.RunStream(context.Background(), ExecRequest{Code: "x"}, Handlers{OnStdout: func(d string) { out.WriteString(d) }}); err != nil || out.String() != "step 1\n" {
		t.Errorf("a run streamed whole: %q, %v; want its output once, not handed on again", out.String(), err)
	}
}

// The recovery budget bounds the search for a run, not the run it found: a
// run still going when the budget ends is followed to its result, as the
// Python and TypeScript clients do.
func TestRecoverRunFollowsAnAttachedRunPastTheSearchBudget(t *testing.T) {
	defer func(d time.Duration) { recoverTimeout = d }(recoverTimeout)
	recoverTimeout = 200 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sessions/s/executions"):
			_, _ = w.Write([]byte(`{"running": true}`))
		case strings.HasSuffix(r.URL.Path, "/sessions/s/exec"):
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.(http.Flusher).Flush()
			time.Sleep(600 * time.Millisecond) // the run goes on past the budget
			_, _ = w.Write([]byte(`{"type":"result","result":{"id":"x","status":"succeeded","stdout":"","stderr":"","result":"'late'"}}` + "\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
	res, err := s.recoverRun(context.Background(), RunRequest{ExecRequest: ExecRequest{ID: "run-1", Code: "x"}}, Handlers{})
	if err != nil {
		t.Fatalf("recoverRun: %v", err)
	}
	if res.Result == nil || *res.Result != "'late'" {
		t.Errorf("result %+v, want the run's", res)
	}
}
