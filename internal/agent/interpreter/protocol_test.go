package interpreter

import (
	"bufio"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// protoFDs is Python that finds the REPL server's channel to the agent (its
// globals are reachable from any helper function's __globals__).
const protoFDs = `import os, json
_server = FINAL.__globals__
def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
`

// violated asserts a run that broke the protocol: ended at once (well within
// its timeout), failed, state lost with the reason, and the next run right on
// a fresh interpreter.
func violated(t *testing.T, it *Interpreter, res *protocol.Result, within time.Duration) {
	t.Helper()
	if res.Status == protocol.StatusSucceeded || !res.StateLost || res.Error == nil ||
		res.Error.Type != ErrorProtocolViolation || !strings.Contains(res.StateLostReason, "protocol") {
		t.Fatalf("want a protocol violation, got %s: %+v (reason %q)", res.Status, res.Error, res.StateLostReason)
	}
	if d := time.Duration(res.DurationMillis * float64(time.Millisecond)); d > within {
		t.Errorf("the violation took %s to end the run", d)
	}
	next := run(t, it, "'kept' in globals(), 6 * 7")
	wantStatus(t, next, protocol.StatusSucceeded)
	if *next.Result != "(False, 42)" || next.StateLost {
		t.Fatalf("next run: %s, stateLost %v", *next.Result, next.StateLost)
	}
}

// Replies and bridge calls written to the channel by the code, without the
// run's secret, end the interpreter: they never become a result.
func TestForgedRepliesEndTheInterpreter(t *testing.T) {
	it := newInterp(t)
	run(t, it, "kept = 'state'")
	res := run(t, it, protoFDs+`
forged = b"".join(json.dumps({"jsonrpc": "2.0", "id": i, "result": {"status": "ok", "result": "'forged'", "error": None}}).encode() + b"\n"
                  for i in range(1, 300))
_write_all(_server["_RPC_OUT"], forged)
import time
time.sleep(30)
'real'`, func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 20000 })
	violated(t, it, res, 5*time.Second)

	run(t, it, "kept = 'state'")
	res = run(t, it, protoFDs+`
call = {"jsonrpc": "2.0", "id": "b1-1", "run": _server["_state"].run_id, "method": "llm_query", "params": {"prompt": "forged"}}
_write_all(_server["_RPC_OUT"], json.dumps(call).encode() + b"\n")
import time
time.sleep(30)`, func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 20000 })
	violated(t, it, res, 5*time.Second)
}

// Code can lie about its own run (it has the run's id and secret), but the
// REPL server's own reply then comes to a channel with no request in flight:
// the interpreter is ended, and the next run says its state is lost.
func TestOwnForgeryIsCaughtByTheNextRun(t *testing.T) {
	it := newInterp(t)
	res := run(t, it, protoFDs+`
kept = 'state'
st = _server["_state"]
_write_all(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": st.run_id, "secret": st.secret,
    "result": {"status": "ok", "result": "'forged'", "error": None}}).encode() + b"\n")
import time
time.sleep(0.3)`)
	wantStatus(t, res, protocol.StatusSucceeded)
	deadline := time.Now().Add(5 * time.Second)
	for it.current() != nil && it.current().gen == 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	next := run(t, it, "'kept' in globals()")
	wantStatus(t, next, protocol.StatusSucceeded)
	if !next.StateLost || !strings.Contains(next.StateLostReason, "no request was in flight") || *next.Result != "False" {
		t.Fatalf("next run: %s, stateLost %v (%q)", *next.Result, next.StateLost, next.StateLostReason)
	}
}

// A thread left running by one run that would take the next request and
// answer it: the agent finds the thread first, and the next run runs its own
// code on a fresh interpreter and says why the state is gone.
func TestThreadLeftRunningCannotAnswerTheNextRun(t *testing.T) {
	it := newInterp(t)
	first := run(t, it, protoFDs+`
import threading
kept = 'state'
def _answer():
    data = os.read(_server["_RPC_IN"], 1 << 20)
    req = json.loads(data.splitlines()[0])
    _write_all(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": req["id"], "secret": req.get("secret"),
        "result": {"status": "ok", "result": "'forged'", "error": None}}).encode() + b"\n")
threading.Thread(target=_answer, daemon=True).start()`)
	wantStatus(t, first, protocol.StatusSucceeded)
	res := run(t, it, "'real', 'kept' in globals()")
	wantStatus(t, res, protocol.StatusSucceeded)
	if *res.Result != "('real', False)" || !res.StateLost || !strings.Contains(res.StateLostReason, "thread") {
		t.Fatalf("result %s, stateLost %v (%q)", *res.Result, res.StateLost, res.StateLostReason)
	}
	// Threads that end with their run cost nothing.
	run(t, it, "import threading\nkept = 'state'\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()")
	res = run(t, it, "kept")
	wantStatus(t, res, protocol.StatusSucceeded)
	if res.StateLost || *res.Result != "'state'" {
		t.Fatalf("a joined thread cost the state: %+v", res)
	}
}

// A fragment on the channel (a lone "{", bytes that are not UTF-8) is a
// protocol violation, not something to read past.
func TestProtocolGarbageEndsTheInterpreter(t *testing.T) {
	it := newInterp(t)
	for _, junk := range []string{`b'{\n'`, `b'\xff\xfe{"jsonrpc": "2.0", "id": \n'`, `b'[]\n'`, `b'{"jsonrpc": "2.0"}\n'`} {
		run(t, it, "kept = 'state'")
		res := run(t, it, protoFDs+"_write_all(_server['_RPC_OUT'], "+junk+")\nimport time\ntime.sleep(30)",
			func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 20000 })
		violated(t, it, res, 5*time.Second)
	}
}

// A 100 MB line on the protocol pipe costs the agent bounded memory, ends the
// interpreter, and only a bounded part of it reaches the agent's log.
func TestOversizedProtocolLineIsBounded(t *testing.T) {
	var logMu sync.Mutex
	logged := 0
	var sample string
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		logged += len(prefix) + len(args)
		if len(sample) < 300 {
			sample += args[:min(len(args), 300)]
		}
		logMu.Unlock()
	}, funcr.Options{Verbosity: 1})
	it := newInterp(t, func(c *Config) { c.Log = log })
	run(t, it, "kept = 'state'")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := run(t, it, protoFDs+`
line = b'{"jsonrpc": "2.0", "id": 1, "result": "' + b'x' * 100_000_000 + b'\n'  # and not even JSON
_write_all(_server["_RPC_OUT"], line)
del line
import time
time.sleep(30)`, func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 40000 })
	runtime.ReadMemStats(&after)
	violated(t, it, res, 20*time.Second)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("agent allocated %d MB while reading a 100 MB line; logged %d bytes: %.200s", alloc>>20, logged, sample)
	if alloc > 48<<20 {
		t.Errorf("the agent allocated %d MB for a 100 MB line", alloc>>20)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if logged > 16<<10 {
		t.Errorf("the agent logged %d bytes of the line", logged)
	}
}

// readLine keeps lines up to the limit and only a sample of longer ones.
func TestReadLineBounds(t *testing.T) {
	long := strings.Repeat("y", 200_000)
	br := bufio.NewReaderSize(strings.NewReader("12345\n123456\n"+long+"\n{}\npartial"), 16)
	for _, want := range []struct {
		line string
		size int
	}{{"12345\n", 5}, {"123456\n", 6}, {long, 200_000}, {"{}\n", 2}, {"partial", 7}} {
		line, size, _ := readLine(br, 5)
		if size != want.size || !strings.HasPrefix(want.line, string(line)) || len(line) == 0 ||
			(size <= 5 && string(line) != want.line) || len(line) > logSample {
			t.Fatalf("got %q (%d), want %.20q (%d)", line, size, want.line, want.size)
		}
	}
}
