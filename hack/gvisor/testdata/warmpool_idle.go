// Added by warmpool's hack/gvisor.sh to gVisor's systrap platform.
//
// controlFastPath decides every recordingPeriod (400 µs) whether the sentry
// and the stub threads should spin for each other's syscall messages: 2,500
// wake-ups a second for every sandbox, busy or idle, which made an idle warm
// sandbox cost about 4 % of a core on a 2-core node. A period in which no
// context switch between the sentry and a stub was recorded (no syscall, no
// fault: the sandbox is idle) has nothing to decide, whether a fast path is
// on or not (one spins only while a switch is under way): the monitor then
// sleeps twice as long each time, up to idleRecordingPeriodMax, and is back
// to recordingPeriod after the first period with activity. The fast path is
// a latency optimisation only; what this costs is up to
// idleRecordingPeriodMax of a burst on the state the idle sandbox left.

package systrap

import "time"

const idleRecordingPeriodMax = 100 * time.Millisecond

// idleAwarePeriod is how long controlFastPath sleeps next. Only its goroutine
// reads and writes it.
var idleAwarePeriod = recordingPeriod

// nextRecordingPeriod is called before the period's state function consumes
// (and resets) its latencies.
func nextRecordingPeriod() time.Duration {
	if !latencies.stubBound.empty() || !latencies.sentryBound.empty() {
		idleAwarePeriod = recordingPeriod
	} else if idleAwarePeriod < idleRecordingPeriodMax {
		idleAwarePeriod = min(2*idleAwarePeriod, idleRecordingPeriodMax)
	}
	return idleAwarePeriod
}

// empty reports whether no latency was recorded in b.
func (b *latencyBuckets) empty() bool {
	for i := range b {
		if b[i].Load() != 0 {
			return false
		}
	}
	return true
}
