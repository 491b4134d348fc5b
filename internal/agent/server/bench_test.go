package server

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/interpreter"
	"github.com/warmpool/warmpool/pkg/protocol"
)

func percentiles(b *testing.B, d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	p := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
}

// BenchmarkExecuteRoundTrip: print(1) over HTTP on loopback, through the
// interpreter and back, as the manager calls it.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	a := startAgent(b, 1)
	ctx := context.Background()
	req := protocol.ExecuteRequest{Code: "print(1)"}
	for i := 0; i < 50; i++ { // warm the connection and the interpreter
		if _, err := a.c.Execute(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		res, err := a.c.Execute(ctx, req)
		lat = append(lat, time.Since(start))
		if err != nil || res.Stdout != "1\n" {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.StopTimer()
	percentiles(b, lat)
}

// BenchmarkInterruptLatency: SIGINT sent to a pure-Python loop until the reply.
func BenchmarkInterruptLatency(b *testing.B) {
	it := interpreter.New(interpreter.Config{Dir: b.TempDir()})
	if err := it.Start(); err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		done := make(chan time.Time)
		go func() {
			res, err := it.Execute(protocol.ExecuteRequest{Code: "i = 0\nwhile True:\n    i += 1"}, interpreter.Hooks{})
			if err != nil || res.Status != protocol.StatusInterrupted || res.StateLost {
				b.Errorf("%+v %v", res, err)
			}
			done <- time.Now()
		}()
		for !it.Busy() {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(5 * time.Millisecond)
		sent := time.Now()
		it.Interrupt()
		lat = append(lat, (<-done).Sub(sent))
	}
	percentiles(b, lat)
}

// BenchmarkInterpreterStart: a fresh python3 with the REPL server, start to ready, no preloads.
func BenchmarkInterpreterStart(b *testing.B) {
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		it := interpreter.New(interpreter.Config{Dir: dir})
		if err := it.Start(); err != nil {
			b.Fatal(err)
		}
		it.Close()
	}
}
