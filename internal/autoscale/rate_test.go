package autoscale

import (
	"math"
	"testing"
	"time"
)

func TestArrivalsRateOverWindows(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a := NewArrivals(60 * time.Second)
	a.Add(t0, 0) // the record starts
	// One claim a second for two minutes: 1/s over both windows.
	for s := 0; s < 120; s++ {
		a.Add(t0.Add(time.Duration(s)*time.Second), 1)
	}
	now := t0.Add(119 * time.Second)
	if r := a.Rate(now, 60*time.Second); r != 1 {
		t.Fatalf("steady long rate %v", r)
	}
	if r := a.Rate(now, 6*time.Second); r != 1 {
		t.Fatalf("steady short rate %v", r)
	}
	// A burst of 60 claims in one second: the short window sees 11/s at
	// once, the long one 2/s.
	now = now.Add(time.Second)
	a.Add(now, 60)
	if r := a.Rate(now, 6*time.Second); math.Abs(r-(60+5)/6.0) > 1e-9 {
		t.Fatalf("short rate after a burst %v", r)
	}
	if r := a.Rate(now, 60*time.Second); math.Abs(r-(60+59)/60.0) > 1e-9 {
		t.Fatalf("long rate after a burst %v", r)
	}
	// Quiet: the burst leaves the short window after 6 s and the long one
	// after 60 s.
	if r := a.Rate(now.Add(6*time.Second), 6*time.Second); r != 0 {
		t.Fatalf("short rate after the burst left %v", r)
	}
	if r := a.Rate(now.Add(59*time.Second), 60*time.Second); r != 1 {
		t.Fatalf("long rate with the burst at its edge %v", r)
	}
	if r := a.Rate(now.Add(60*time.Second), 60*time.Second); r != 0 {
		t.Fatalf("long rate after the burst left %v", r)
	}
	// Far later (the ring wrapped many times): nothing is left over.
	if r := a.Rate(now.Add(time.Hour), 60*time.Second); r != 0 {
		t.Fatalf("rate an hour later %v", r)
	}
	a.Add(now.Add(time.Hour), 3)
	if r := a.Rate(now.Add(time.Hour), 60*time.Second); r != 3.0/60 {
		t.Fatalf("rate after a claim an hour later %v", r)
	}
}

// A young record divides by its age: a pool that starts with a burst is
// sized for it at once.
func TestArrivalsYoungRecordIsNotDiluted(t *testing.T) {
	t0 := time.Unix(2_000_000, 0)
	a := NewArrivals(60 * time.Second)
	a.Add(t0, 10)
	if r := a.Rate(t0, 60*time.Second); r != 10 {
		t.Fatalf("rate in the first second %v", r)
	}
	if r := a.Rate(t0.Add(4*time.Second), 60*time.Second); r != 2 {
		t.Fatalf("rate after five seconds %v", r)
	}
	if r := a.Rate(t0.Add(2*time.Minute), 60*time.Second); r != 0 {
		t.Fatalf("rate after two minutes %v", r)
	}
}

// A restarted manager sees the waiting claims again, at their creation
// times: recent ones count over the time since the oldest of them, old ones
// not at all.
func TestArrivalsAddAtCreationTimes(t *testing.T) {
	now := time.Unix(3_000_000, 0)
	a := NewArrivals(60 * time.Second)
	a.AddAt(now, now.Add(-2*time.Minute)) // older than the window
	for s := 1; s <= 10; s++ {
		a.AddAt(now, now.Add(-time.Duration(s)*time.Second))
	}
	a.AddAt(now, now.Add(time.Hour)) // skewed clock: now
	if r := a.Rate(now, 60*time.Second); math.Abs(r-11.0/11) > 1e-9 {
		t.Fatalf("rate %v, want 11 claims over the 11 s since the oldest", r)
	}
}
