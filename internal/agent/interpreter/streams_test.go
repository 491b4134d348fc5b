package interpreter

import (
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// Closing or replacing the standard streams in one execution does not break
// output capture of the next ones.
func TestStdStreamsAreRestoredBeforeEachRun(t *testing.T) {
	it := newInterp(t)
	for _, tc := range []struct{ name, breakIt string }{
		{"os.close(1)", "import os\nos.close(1)"},
		{"os.close(1) and os.close(2)", "import os\nos.close(1)\nos.close(2)"},
		{"sys.stdout = None", "import sys\nsys.stdout = None\nsys.stderr = None"},
		{"sys.stdout = a file", "import sys, os\nsys.stdout = open(os.devnull, 'w')\nsys.stderr = open(os.devnull, 'w')"},
		{"sys.stdout.close()", "import sys\nsys.stdout.close()\nsys.stderr.close()"},
		{"dup2 onto fd 1 and 2", "import os\nfd = os.open(os.devnull, os.O_WRONLY)\nos.dup2(fd, 1)\nos.dup2(fd, 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, it, tc.breakIt+"\n'broke'")
			wantStatus(t, res, protocol.StatusSucceeded)
			if res.DurationMillis > 1500 {
				t.Errorf("the run that broke its streams took %.0f ms", res.DurationMillis)
			}
			res = run(t, it, "import os, sys\nprint('out')\nprint('err', file=sys.stderr)\nos.write(1, b'fd1\\n')\n'ok'")
			wantStatus(t, res, protocol.StatusSucceeded)
			if res.Stdout != "out\nfd1\n" || res.Stderr != "err\n" || *res.Result != "'ok'" {
				t.Fatalf("after %s: stdout=%q stderr=%q", tc.name, res.Stdout, res.Stderr)
			}
			if res.DurationMillis > 1500 {
				t.Errorf("the next run took %.0f ms", res.DurationMillis)
			}
		})
	}
	t.Run("os.close(0)", func(t *testing.T) {
		wantStatus(t, run(t, it, "import os, sys\nos.close(0)\nsys.stdin = None"), protocol.StatusSucceeded)
		res := run(t, it, "input()")
		if res.Error == nil || res.Error.Type != "EOFError" {
			t.Fatalf("input() after os.close(0): %+v", res.Error)
		}
	})
}
