package interpreter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/protocol"
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
