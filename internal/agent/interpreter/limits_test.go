package interpreter

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// Earlier executions' source does not pile up in linecache; tracebacks of the
// current run (and of recent small runs) still show source lines.
func TestLinecacheIsBounded(t *testing.T) {
	it := newInterp(t)
	big := "x = 1\n" + strings.Repeat("# a padding line that makes this source about one megabyte\n", 17000)
	for i := 0; i < 10; i++ {
		wantStatus(t, run(t, it, big), protocol.StatusSucceeded)
	}
	wantStatus(t, run(t, it, "def helper():\n    raise ValueError('from helper')"), protocol.StatusSucceeded)
	res := run(t, it, "import linecache\nsum(len(''.join(e[2])) for k, e in list(linecache.cache.items()) if k.startswith('<exec-'))")
	wantStatus(t, res, protocol.StatusSucceeded)
	kept, _ := strconv.Atoi(*res.Result)
	t.Logf("linecache keeps %d characters of source after 10 runs of %d", kept, len(big))
	if kept > 2<<20 {
		t.Fatalf("linecache keeps %d characters of earlier runs' source", kept)
	}
	res = run(t, it, big+"helper()\n")
	wantStatus(t, res, protocol.StatusFailed)
	tb := res.Error.Traceback
	if !strings.Contains(tb, "helper()") || !strings.Contains(tb, "raise ValueError('from helper')") || !strings.Contains(tb, "line 2, in helper") {
		t.Fatalf("traceback lacks source lines:\n%s", tb)
	}
}

// get_variable of a huge value is refused with the limit, not read whole.
func TestVariableTooLarge(t *testing.T) {
	it := newInterp(t)
	wantStatus(t, run(t, it, "big = 'x' * 20_000_000\nsmall = [1, 2]\nnan = float('nan')"), protocol.StatusSucceeded)
	start := time.Now()
	v, found, err := it.Variable("big")
	if err == nil || !strings.Contains(err.Error(), "larger than") || !strings.Contains(err.Error(), fmt.Sprint(DefaultMaxVariableBytes)) {
		t.Fatalf("big: found=%v len(json)=%d err=%v", found, len(v.JSON), err)
	}
	var tooLarge *VariableTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Limit != DefaultMaxVariableBytes || tooLarge.Name != "big" {
		t.Fatalf("big: err = %#v", err)
	}
	t.Logf("refused in %s: %v", time.Since(start), err)
	v, found, err = it.Variable("small")
	if err != nil || !found || string(v.JSON) != "[1,2]" {
		t.Fatalf("small: %+v %v %v", v, found, err)
	}
	// NaN is not JSON: the repr, not a broken message.
	v, found, err = it.Variable("nan")
	if err != nil || !found || v.Repr != "nan" || len(v.JSON) != 0 {
		t.Fatalf("nan: %+v %v %v", v, found, err)
	}
}

func limited(l Limits) func(*Config) { return func(c *Config) { c.Limits = l } }

// The attack: allocate 50 MB at a time until something gives. The code sees
// MemoryError with the interpreter (and its state) alive and its output kept.
func TestMemoryBudgetRaisesMemoryError(t *testing.T) {
	it := newInterp(t, limited(Limits{MemoryBytes: 300 << 20}))
	wantStatus(t, run(t, it, "kept = 'state'"), protocol.StatusSucceeded)
	res := run(t, it, "hog = []\nfor i in range(40):\n    hog.append(bytearray(50 << 20))\n    print('allocated', (i + 1) * 50, 'MB', flush=True)")
	wantStatus(t, res, protocol.StatusFailed)
	if res.Error == nil || res.Error.Type != "MemoryError" {
		t.Fatalf("error = %+v, want MemoryError", res.Error)
	}
	if !strings.Contains(res.Stdout, "allocated 100 MB\n") || strings.Contains(res.Stdout, "allocated 300 MB") {
		t.Fatalf("stdout = %q: want the lines printed before the limit, and none past it", res.Stdout)
	}
	if res.StateLost {
		t.Fatal("state lost: the interpreter should survive a MemoryError")
	}
	res = run(t, it, "del hog\nkept")
	wantStatus(t, res, protocol.StatusSucceeded)
	if *res.Result != "'state'" {
		t.Fatalf("result = %s", *res.Result)
	}
}

// The attack the address-space limit cannot see: many processes, each under
// it. The watchdog kills them all and says why, with the output so far.
func TestMemoryBudgetAcrossProcesses(t *testing.T) {
	it := newInterp(t, limited(Limits{MemoryBytes: 200 << 20}))
	res := run(t, it, `import os, time
print('forking', flush=True)
for i in range(6):
    if os.fork() == 0:
        hog = bytearray(80 << 20)
        time.sleep(60)
        os._exit(0)
time.sleep(30)
print('never printed')`)
	wantStatus(t, res, protocol.StatusFailed)
	if res.Error == nil || res.Error.Type != ErrorMemoryLimitExceeded || !strings.Contains(res.Error.Message, "budget of 200 MiB") {
		t.Fatalf("error = %+v, want %s naming the budget", res.Error, ErrorMemoryLimitExceeded)
	}
	if res.Stdout != "forking\n" || !res.StateLost {
		t.Fatalf("stdout=%q stateLost=%v", res.Stdout, res.StateLost)
	}
	for pid := range allProcs() {
		if tagOf(pid) == res.Interpreter {
			t.Fatalf("process %d of the killed interpreter is still alive", pid)
		}
	}
	wantStatus(t, run(t, it, "print('fresh')"), protocol.StatusSucceeded)
}

// The process limit is on the interpreter and what it starts, as a hard limit.
// (Tests run as root, which RLIMIT_NPROC exempts: the fork bomb itself is the
// e2e suite's, on gVisor as the sandbox user.)
func TestProcessLimitIsSet(t *testing.T) {
	it := newInterp(t, limited(Limits{Processes: 77}))
	res := run(t, it, `import resource, subprocess, sys
own = resource.getrlimit(resource.RLIMIT_NPROC)
child = subprocess.run([sys.executable, '-c', 'import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[1])'],
                       capture_output=True, text=True).stdout.strip()
(own, child)`)
	wantStatus(t, res, protocol.StatusSucceeded)
	if *res.Result != "((77, 77), '77')" {
		t.Fatalf("limits = %s, want 77 for the interpreter and its children", *res.Result)
	}
}

// Forked processes share their parent's pages: the budget counts them once
// (proportional set size), so ordinary fork-based parallelism is not killed.
func TestMemoryBudgetCountsSharedPagesOnce(t *testing.T) {
	it := newInterp(t, limited(Limits{MemoryBytes: 250 << 20}))
	res := run(t, it, `import os, time
data = bytearray(100 << 20)
for i in range(0, len(data), 4096):
    data[i] = 1
pids = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print('all done')`)
	wantStatus(t, res, protocol.StatusSucceeded)
	if res.Stdout != "all done\n" {
		t.Fatalf("stdout = %q", res.Stdout)
	}
}

// A memory limit is no thread limit: code under the budget of a 512Mi
// sandbox starts a hundred threads (RLIMIT_AS counts each stack and malloc arena).
func TestMemoryBudgetLeavesRoomForThreads(t *testing.T) {
	it := newInterp(t, limited(Limits{MemoryBytes: 416 << 20}))
	res := run(t, it, `import threading, time
stop = threading.Event()
threads = [threading.Thread(target=lambda: [bytearray(1000) for _ in range(100)] and stop.wait(), daemon=True) for _ in range(100)]
for t in threads:
    t.start()
stop.set()
len(threads)`)
	wantStatus(t, res, protocol.StatusSucceeded)
}

// The numeric libraries run one thread each, unless the pool's env says
// otherwise; under a memory limit malloc's arenas are bounded too.
func TestLimitsEnvSingleThreadsNumericLibraries(t *testing.T) {
	got := Limits{MemoryBytes: 512 << 20}.env([]string{"OMP_NUM_THREADS=4"})
	for _, want := range []string{"OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1", "NUMEXPR_MAX_THREADS=1", "MALLOC_ARENA_MAX=2"} {
		if !slices.Contains(got, want) {
			t.Errorf("env %q lacks %s", got, want)
		}
	}
	if slices.Contains(got, "OMP_NUM_THREADS=1") {
		t.Errorf("env %q overrides the pool's OMP_NUM_THREADS", got)
	}
	if got := (Limits{}).env(nil); !slices.Contains(got, "OPENBLAS_NUM_THREADS=1") || slices.ContainsFunc(got,
		func(kv string) bool { return strings.HasPrefix(kv, "MALLOC_ARENA_MAX=") }) {
		t.Errorf("no limit, env %q", got)
	}
}
