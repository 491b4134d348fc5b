package interpreter

import (
	"fmt"
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// BenchmarkPrintFlood: code that prints a line at a time, as the agent streams
// it (hooks set). The interpreter's own time per line is the result's
// duration over the lines; docs/performance.md has the numbers.
func BenchmarkPrintFlood(b *testing.B) {
	const lines = 20000
	it := New(Config{Dir: b.TempDir(), DefaultGrace: 1e9})
	if err := it.Start(); err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := it.Execute(protocol.ExecuteRequest{ID: fmt.Sprint("flood-", i), MaxOutputBytes: 64 << 10,
			Code: fmt.Sprintf("for i in range(%d):\n    print(i)", lines)},
			Hooks{OnStdout: func([]byte) {}, OnStderr: func([]byte) {}})
		if err != nil || res.Status != protocol.StatusSucceeded {
			b.Fatalf("%v %+v", err, res)
		}
		b.ReportMetric(res.DurationMillis*1e6/lines, "ns/line")
	}
}
