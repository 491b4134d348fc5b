package interpreter

import (
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// Hostile code against the interpreter's own machinery: whatever it does, the
// agent keeps its deadline, interrupt and reset, the next run goes to the
// interpreter that holds the state, and lost state is reported as lost.

// sessionRun runs code as a Session's run: on the interpreter tagged tag only.
func sessionRun(t *testing.T, it *Interpreter, tag, code string, mut ...func(*protocol.ExecuteRequest)) *protocol.Result {
	t.Helper()
	return run(t, it, code, append(mut, func(r *protocol.ExecuteRequest) { r.Interpreter = tag })...)
}

// stateKeptOrReportedLost is the invariant after each attack: the next run of
// the session either finds its variable or is told its state is gone.
func stateKeptOrReportedLost(t *testing.T, it *Interpreter, tag string) {
	t.Helper()
	res := sessionRun(t, it, tag, "kept")
	switch {
	case res.Status == protocol.StatusSucceeded && res.Result != nil && *res.Result == "'yes'":
	case res.StateLost && res.Error != nil && res.Error.Type == protocol.ErrorInterpreterRestarted:
	default:
		t.Fatalf("the next run found neither its state nor word that it is lost: %+v %+v", res, res.Error)
	}
}

func TestForkedInterpreterChildNeverServes(t *testing.T) {
	it := newInterp(t)
	first := run(t, it, "import os\nkept = 'yes'\nserver = os.getpid()\nchild = os.fork()\nchild")
	wantStatus(t, first, protocol.StatusSucceeded)
	for i := 0; i < 5; i++ {
		res := sessionRun(t, it, first.Interpreter, "os.getpid() == server")
		wantStatus(t, res, protocol.StatusSucceeded)
		if *res.Result != "True" {
			t.Fatalf("run %d went to the forked child, not the interpreter", i)
		}
	}
	start := time.Now()
	res := sessionRun(t, it, first.Interpreter, "import time\ntime.sleep(30)", func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 300 })
	wantStatus(t, res, protocol.StatusTimedOut)
	if res.StateLost || time.Since(start) > 5*time.Second {
		t.Fatalf("the timeout did not interrupt the interpreter: %+v after %s", res.Error, time.Since(start))
	}
	stateKeptOrReportedLost(t, it, first.Interpreter)
}

func TestSignalHandlerRaisingWhileIdle(t *testing.T) {
	it := newInterp(t)
	first := run(t, it, "import signal\nkept = 'yes'\nsignal.signal(signal.SIGALRM, lambda *a: 1 / 0)\nsignal.setitimer(signal.ITIMER_REAL, 0.1)")
	wantStatus(t, first, protocol.StatusSucceeded)
	time.Sleep(300 * time.Millisecond) // the handler raises in the server's idle loop
	stateKeptOrReportedLost(t, it, first.Interpreter)
	res := run(t, it, "1 + 1")
	wantStatus(t, res, protocol.StatusSucceeded)
}

func TestPatchedModulesDoNotBreakTheServer(t *testing.T) {
	it := newInterp(t)
	first := run(t, it, "import json, os\nkept = 'yes'\njson.dumps = lambda *a, **k: 'garbage'\njson.loads = lambda *a, **k: 1 / 0\n"+
		"os.read = lambda *a: b''\nos.write = lambda *a: 0")
	wantStatus(t, first, protocol.StatusSucceeded)
	stateKeptOrReportedLost(t, it, first.Interpreter)
}

func TestClosedProtocolDescriptorsAreReportedLost(t *testing.T) {
	it := newInterp(t)
	// The run itself may end either way (killed, or died); the next must not hang.
	first := run(t, it, "import os, sys\nkept = 'yes'\nm = sys.modules['__main__']\nos.close(m._RPC_IN)\nos.close(m._RPC_OUT)")
	start := time.Now()
	stateKeptOrReportedLost(t, it, first.Interpreter)
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the next run took %s", time.Since(start))
	}
}

func TestVariableWhoseReprNeverReturns(t *testing.T) {
	it := newInterp(t, func(c *Config) { c.VariableTimeout = 500 * time.Millisecond })
	first := run(t, it, "class Slow:\n    def __repr__(self):\n        while True:\n            pass\nslow = Slow()\nkept = 'yes'")
	wantStatus(t, first, protocol.StatusSucceeded)
	start := time.Now()
	if _, _, err := it.Variable("slow"); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("variable: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("the variable call took %s", time.Since(start))
	}
	// The innocent next run is not killed: the repr was interrupted.
	res := sessionRun(t, it, first.Interpreter, "kept")
	wantStatus(t, res, protocol.StatusSucceeded)

	stubborn := run(t, it, "class Stubborn:\n    def __repr__(self):\n        while True:\n            try:\n                while True:\n"+
		"                    pass\n            except KeyboardInterrupt:\n                pass\nstubborn = Stubborn()")
	wantStatus(t, stubborn, protocol.StatusSucceeded)
	_, _, err := it.Variable("stubborn")
	if err == nil || !strings.Contains(err.Error(), "state") {
		t.Fatalf("a repr that ignores the interrupt: %v", err)
	}
	stateKeptOrReportedLost(t, it, first.Interpreter)
	wantStatus(t, run(t, it, "1 + 1"), protocol.StatusSucceeded)
}
