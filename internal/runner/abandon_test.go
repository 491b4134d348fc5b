package runner_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/runner"
	"github.com/warmpool/warmpool/pkg/protocol"
)

func job(uid, base string) runner.Job {
	return runner.Job{UID: types.UID(uid), Namespace: "ns", Name: uid, Agent: agentclient.New(base, "token"),
		Request: protocol.ExecuteRequest{Code: "print(1)"}, Deadline: time.Now().Add(time.Minute), Grace: time.Second, Fresh: true}
}

// refused is an agent URL where nothing listens: connections are refused.
func refused(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr
}

// A run whose agent cannot be reached (nothing listens at its address) never
// wrote its request: Abandon says the code cannot have run, so it may run
// elsewhere.
func TestAbandonARunThatNeverReachedItsAgent(t *testing.T) {
	// Every dial is refused, and counted: the run's send has failed (and the
	// run follows the agent by its ID) once the first dial is seen.
	dialed := make(chan struct{}, 100)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed <- struct{}{}
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}}}
	j := job("never", "http://agent.invalid:8080")
	j.Agent = agentclient.NewWithHTTP("http://agent.invalid:8080", "token", hc)
	r := runner.New(nil)
	r.Start(j)
	select {
	case <-dialed:
	case <-time.After(5 * time.Second):
		t.Fatal("the run never tried to reach its agent")
	}
	if r.Abandon("never", 5*time.Second) {
		t.Fatal("Abandon says the code may have run, but no connection to the agent was ever made")
	}
	if _, ok := r.Outcome("never"); !ok {
		t.Fatal("the abandoned run has no outcome: its goroutine may still be running")
	}
}

// A run whose request reached the agent may have run, even though the agent
// never answered: Abandon says so, and the code is never sent elsewhere.
func TestAbandonARunWhoseRequestWasWritten(t *testing.T) {
	got := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got <- struct{}{}
		<-release // an agent that took the code and then went silent
	}))
	defer srv.Close()
	defer close(release)
	r := runner.New(nil)
	r.Start(job("sent", srv.URL))
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached the agent")
	}
	if !r.Abandon("sent", 5*time.Second) {
		t.Fatal("Abandon says the code cannot have run, but the agent received it")
	}
}

// A run this runner did not start (re-attached after a restart) may have run.
func TestAbandonARunReattachedTo(t *testing.T) {
	r := runner.New(nil)
	r.Attach(job("attached", refused(t)))
	if !r.Abandon("attached", time.Second) {
		t.Fatal("Abandon says a run it did not send cannot have run")
	}
	if !r.Abandon("unknown", time.Second) {
		t.Fatal("Abandon says a run it does not know cannot have run")
	}
}

// A send that is not the code's first (a claim found after a restart, whose
// earlier manager may have sent it) may have run, whatever this send wrote.
func TestAbandonARunSentAgain(t *testing.T) {
	r := runner.New(nil)
	j := job("again", refused(t))
	j.Fresh = false
	r.Start(j)
	if !r.Abandon("again", 5*time.Second) {
		t.Fatal("Abandon says a run sent again cannot have run")
	}
}
