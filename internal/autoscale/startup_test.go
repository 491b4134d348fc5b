package autoscale

import (
	"testing"
	"time"
)

func TestStartupFollowsSlowerStarts(t *testing.T) {
	var s Startup
	if got := s.Estimate(5 * time.Second); got != 5*time.Second {
		t.Fatalf("before any start: %v", got)
	}
	for range 30 {
		s.Observe(2 * time.Second)
	}
	if got := s.Estimate(0); got < 2*time.Second || got > 2100*time.Millisecond {
		t.Fatalf("steady 2 s starts: %v", got)
	}
	// Starts slow down (twenty pods boot at once): within a dozen starts
	// the estimate is most of the way there, and above the new mean while
	// it moves.
	for range 12 {
		s.Observe(10 * time.Second)
	}
	if got := s.Estimate(0); got < 8*time.Second {
		t.Fatalf("after a dozen 10 s starts: %v", got)
	}
	// Varying starts plan above their mean.
	var v Startup
	for i := range 40 {
		v.Observe(time.Duration(1+2*(i%2)) * time.Second) // 1 s, 3 s, 1 s, ...
	}
	if got := v.Estimate(0); got < 2500*time.Millisecond || got > 3500*time.Millisecond {
		t.Fatalf("alternating 1 s and 3 s starts: %v", got)
	}
	v.Observe(-time.Second) // a clock step: ignored
	if v.Observed() != 40 {
		t.Fatalf("observed %d", v.Observed())
	}
}
