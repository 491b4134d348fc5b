// Added by warmpool's hack/gvisor.sh: the test of warmpool_idle.go, run in the
// patched package before runsc is built from it.

package systrap

import (
	"testing"
	"time"
)

// period runs one period of controlFastPath's loop, as patched, and returns
// how long it would sleep next.
func period() time.Duration {
	d := nextRecordingPeriod()
	fastpath.curState(&fastpath)
	stateConsumed()
	return d
}

func TestIdleBacksOffWithLeftoverLatencies(t *testing.T) {
	saved := fastpath.curState
	t.Cleanup(func() {
		fastpath.curState = saved
		latencies.stubBound.reset()
		latencies.sentryBound.reset()
		idleAwarePeriod, recordedAfterState = recordingPeriod, 0
	})
	// The state an idle sandbox is left in: the sentry's fast path on, and
	// fewer recordings than it needs to judge, which it leaves in place.
	fastpath.curState = sentryOnStubOff
	latencies.stubBound.record(bucketIncrements)
	latencies.sentryBound.record(bucketIncrements)

	var d time.Duration
	for range 20 {
		d = period()
	}
	if recordedLatencies() == 0 {
		t.Fatal("the state function reset the leftover latencies: this test no longer sets up the idle sandbox's state")
	}
	if d != idleRecordingPeriodMax {
		t.Fatalf("idle with leftover latencies: the monitor sleeps %v, want %v", d, idleRecordingPeriodMax)
	}

	// A switch between the sentry and a stub: back to the fast period.
	latencies.sentryBound.record(bucketIncrements)
	if d := period(); d != recordingPeriod {
		t.Fatalf("after a recorded switch the monitor sleeps %v, want %v", d, recordingPeriod)
	}
	if d := period(); d != 2*recordingPeriod {
		t.Fatalf("a quiet period after it: %v, want %v", d, 2*recordingPeriod)
	}
}
