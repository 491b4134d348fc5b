package autoscale

import "time"

// Arrivals counts the claims of one pool in one-second buckets over the
// longest window asked of it, so that the rates over a long and a short
// window come from one record. Not safe for concurrent use.
type Arrivals struct {
	buckets []int64 // buckets[s % len] counts the claims of Unix second s
	oldest  int64   // the oldest second the buckets hold
	first   time.Time
}

// NewArrivals keeps window (whole seconds, at least one) of claims.
func NewArrivals(window time.Duration) *Arrivals {
	return &Arrivals{buckets: make([]int64, max(int(window/time.Second), 1))}
}

// Add records n claims at now.
func (a *Arrivals) Add(now time.Time, n int) {
	a.advance(now)
	a.buckets[a.index(now.Unix())] += int64(n)
}

// AddAt records one claim made at (its creation time) and seen at now:
// claims a restarted manager sees again count if they are recent, once, as
// the caller sees each once. A claim older than the window is ignored; one
// dated after now (clock skew) counts at now.
func (a *Arrivals) AddAt(now, at time.Time) {
	a.advance(now)
	if at.After(now) {
		at = now
	}
	if at.Unix() < a.oldest {
		return
	}
	if at.Before(a.first) { // the record covers the time since its oldest claim
		a.first = at
	}
	a.buckets[a.index(at.Unix())]++
}

// Rate is the claims per second over the window up to now (at most the
// record's). A record younger than the window divides by its age, so that
// the first burst after a start is seen at once, not diluted.
func (a *Arrivals) Rate(now time.Time, window time.Duration) float64 {
	sum := a.Count(now, window)
	span := time.Duration(min(max(int(window/time.Second), 1), len(a.buckets))) * time.Second
	if age := now.Sub(a.first).Truncate(time.Second) + time.Second; age < span {
		span = age
	}
	return float64(sum) / span.Seconds()
}

// Count is the claims in the window up to now (at most the record's).
func (a *Arrivals) Count(now time.Time, window time.Duration) int64 {
	a.advance(now)
	n := int64(min(max(int(window/time.Second), 1), len(a.buckets)))
	end := now.Unix()
	var sum int64
	for s := end - n + 1; s <= end; s++ {
		if s >= a.oldest {
			sum += a.buckets[a.index(s)]
		}
	}
	return sum
}

func (a *Arrivals) index(s int64) int {
	n := int64(len(a.buckets))
	return int(((s % n) + n) % n)
}

// advance empties the buckets of seconds that left the window before now.
func (a *Arrivals) advance(now time.Time) {
	oldest := now.Unix() - int64(len(a.buckets)) + 1
	if a.first.IsZero() {
		a.first, a.oldest = now, oldest
		return
	}
	if oldest <= a.oldest {
		return
	}
	if oldest-a.oldest >= int64(len(a.buckets)) {
		clear(a.buckets)
	} else {
		for s := a.oldest; s < oldest; s++ {
			a.buckets[a.index(s)] = 0
		}
	}
	a.oldest = oldest
}
