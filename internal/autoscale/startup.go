package autoscale

import "time"

// Startup is a moving estimate of how long the pool's pods take from
// creation to Ready: an exponentially weighted mean and mean deviation (as
// TCP estimates round trips), so that a pool whose starts slow down under
// load, or vary, keeps more pods warm. Not safe for concurrent use.
type Startup struct {
	mean, dev time.Duration
	n         int
}

// startupWeight is the weight of a new observation (1/8, as TCP's SRTT):
// about the last dozen starts count.
const startupWeight = 0.125

// Observe adds the start-up time of one pod.
func (s *Startup) Observe(d time.Duration) {
	if d < 0 {
		return
	}
	if s.n == 0 {
		s.mean, s.dev = d, d/2
	} else {
		diff := d - s.mean
		if diff < 0 {
			diff = -diff
		}
		s.dev += time.Duration(startupWeight * float64(diff-s.dev))
		s.mean += time.Duration(startupWeight * float64(d-s.mean))
	}
	s.n++
}

// Estimate is the start-up time to plan for: the mean plus one mean
// deviation, or fallback before any pod of the pool became Ready.
func (s *Startup) Estimate(fallback time.Duration) time.Duration {
	if s.n == 0 {
		return fallback
	}
	return s.mean + s.dev
}

// Observed is how many start-ups the estimate holds.
func (s *Startup) Observed() int { return s.n }
