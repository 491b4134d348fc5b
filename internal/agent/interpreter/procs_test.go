package interpreter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) < i+3 || (b[i+2] != 'Z' && b[i+2] != 'X')
}

func killAtCleanup(t *testing.T, pids ...int) {
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// startDetached is Python that starts two processes that leave the
// interpreter's process group: one with start_new_session that holds the
// interpreter's stdout and writes to it later, and a double-forked daemon with
// an empty environment. Its value is their PIDs as the agent sees them
// (/proc/self: the interpreter may have a PID namespace of its own).
const startDetached = `import subprocess, sys, os, time
for f in ('detached.pid',):
    if os.path.exists(f):
        os.remove(f)
detached = subprocess.Popen([sys.executable, '-c', 'import time, os; open("detached.pid.tmp", "w").write(os.readlink("/proc/self")); os.rename("detached.pid.tmp", "detached.pid"); time.sleep(3); os.write(1, b"late\\n")'], start_new_session=True)
daemon = subprocess.run([sys.executable, '-c', '''
import os, sys, time
if os.fork() == 0:
    os.setsid()
    os.write(1, os.readlink("/proc/self").encode())
    os.close(1); os.close(2)
    time.sleep(60)
'''], env={}, capture_output=True, check=True)
while not os.path.exists('detached.pid'):
    time.sleep(0.01)
[int(open('detached.pid').read()), int(daemon.stdout)]`

func detachedPIDs(t *testing.T, res *protocol.Result) []int {
	t.Helper()
	wantStatus(t, res, protocol.StatusSucceeded)
	var pids []int
	if err := json.Unmarshal([]byte(*res.Result), &pids); err != nil || len(pids) != 2 {
		t.Fatalf("pids %s: %v", *res.Result, err)
	}
	killAtCleanup(t, pids...)
	for _, pid := range pids {
		if !processAlive(pid) {
			t.Fatalf("process %d is not running", pid)
		}
	}
	return pids
}

// Reset (the FreshInterpreter reset) ends every process the code started, also
// those in a session of their own, and lets the next runs report promptly.
func TestResetEndsEveryProcessTheCodeStarted(t *testing.T) {
	it := newInterp(t)
	pids := detachedPIDs(t, run(t, it, startDetached))
	if err := it.Reset(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d survived the reset", pid)
		}
	}
	// The same after a kill at the end of the grace period.
	pids = detachedPIDs(t, run(t, it, startDetached))
	res := run(t, it, "import time\nwhile True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass",
		func(r *protocol.ExecuteRequest) { r.TimeoutMillis = 100; r.GraceMillis = 100 })
	if res.Error == nil || res.Error.Type != protocol.ErrorInterpreterKilled {
		t.Fatalf("result = %+v", res)
	}
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d survived the kill of the interpreter", pid)
		}
	}
	res = run(t, it, "print('next')")
	wantStatus(t, res, protocol.StatusSucceeded)
	if res.Stdout != "next\n" {
		t.Fatalf("stdout = %q", res.Stdout)
	}
}

// An interpreter that dies while a detached child holds its output pipes is
// reported at once, and the child does not outlive it.
func TestDeathWithDetachedChildIsReportedPromptly(t *testing.T) {
	it := newInterp(t)
	pids := detachedPIDs(t, run(t, it, startDetached))
	res := run(t, it, "import os\nos._exit(3)")
	wantStatus(t, res, protocol.StatusFailed)
	if res.Error.Type != protocol.ErrorInterpreterDied || !strings.Contains(res.Error.Message, "exit code 3") {
		t.Fatalf("error = %+v", res.Error)
	}
	if res.DurationMillis > 1500 {
		t.Errorf("the death took %.0f ms to report", res.DurationMillis)
	}
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("process %d outlived the interpreter", pid)
		}
	}
	res = run(t, it, "import os\nos._exit(4)")
	if res.DurationMillis > 1500 || !strings.Contains(res.Error.Message, "exit code 4") {
		t.Errorf("second death: %.0f ms, %+v", res.DurationMillis, res.Error)
	}
}
