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
// At 100 ms, the monitor's ten wake-ups a second (and the Go scheduler's and
// sysmon's work around each) were still most of an idle sentry's CPU.
//
// "No switch recorded" means no recording added since the state function last
// ran, not empty buckets: a state function that finds too few recordings to
// judge (sentryOnStubOff, sentryOffStubOn) returns without resetting them, so
// the few switches of a sandbox's last activity stay in the buckets for as
// long as it idles, and a monitor that waited for empty buckets never backed
// off (measured: an idle sandbox's sentry spent 65 % of its CPU in this loop).

package systrap

import "time"

const idleRecordingPeriodMax = time.Second

var (
	// idleAwarePeriod is how long controlFastPath sleeps next. Only its
	// goroutine reads and writes it, as it does recordedAfterState.
	idleAwarePeriod = recordingPeriod
	// recordedAfterState is how many latencies the buckets held when the
	// last period's state function returned.
	recordedAfterState uint64
)

// nextRecordingPeriod is called before the period's state function consumes
// (and may reset) its latencies.
func nextRecordingPeriod() time.Duration {
	if recordedLatencies() != recordedAfterState {
		idleAwarePeriod = recordingPeriod
	} else if idleAwarePeriod < idleRecordingPeriodMax {
		idleAwarePeriod = min(2*idleAwarePeriod, idleRecordingPeriodMax)
	}
	return idleAwarePeriod
}

// stateConsumed is called after the period's state function: what it left in
// the buckets is not news in the next period.
func stateConsumed() {
	recordedAfterState = recordedLatencies()
}

// recordedLatencies is how many latencies both buckets hold.
func recordedLatencies() uint64 {
	var n uint64
	for i := range latencies.stubBound {
		n += latencies.stubBound[i].Load() + latencies.sentryBound[i].Load()
	}
	return n
}
