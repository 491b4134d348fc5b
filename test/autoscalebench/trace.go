package main

import (
	"fmt"
	"math/rand"
	"time"
)

// phase is a stretch of the trace with a constant Poisson arrival rate.
type phase struct {
	Name    string
	Rate    float64 // claims per second
	Seconds float64
}

// arrival is one claim of the trace: when, and in which phase.
type arrival struct {
	At    time.Duration
	Phase int
}

// traces are the shapes the benchmark replays: steady demand, bursts of
// several times the steady rate, and a quiet stretch long enough for a
// scale-down. The rates are what two cores sustain with five pools at once
// without slowing pod start-ups much (at 3/s bursts the start-ups' p90 passed
// three times the nominal delay). "cluster" is smaller, for gVisor pods.
var traces = map[string][]phase{
	"full": {
		{"steady", 0.3, 60}, {"burst", 2, 15}, {"steady", 0.3, 45},
		{"quiet", 0, 60}, {"burst", 1.5, 15}, {"steady", 0.3, 45},
	},
	"short": {
		{"steady", 0.5, 20}, {"burst", 3, 8}, {"quiet", 0, 15}, {"steady", 0.5, 15},
	},
	"cluster": {
		{"steady", 0.2, 40}, {"burst", 1, 15}, {"steady", 0.2, 20},
		{"quiet", 0, 40}, {"steady", 0.2, 25},
	},
}

// generate draws the arrivals of phases from seed: exponential gaps within
// each phase (the memoryless property lets a phase start afresh at its
// boundary).
func generate(phases []phase, seed int64) []arrival {
	rng := rand.New(rand.NewSource(seed))
	var out []arrival
	start := 0.0
	for i, p := range phases {
		end := start + p.Seconds
		if p.Rate > 0 {
			for t := start + rng.ExpFloat64()/p.Rate; t < end; t += rng.ExpFloat64() / p.Rate {
				out = append(out, arrival{At: time.Duration(t * float64(time.Second)), Phase: i})
			}
		}
		start = end
	}
	return out
}

func length(phases []phase) time.Duration {
	total := 0.0
	for _, p := range phases {
		total += p.Seconds
	}
	return time.Duration(total * float64(time.Second))
}

// meanRate is the trace's expected claims per second over its whole length.
func meanRate(phases []phase) float64 {
	claims := 0.0
	for _, p := range phases {
		claims += p.Rate * p.Seconds
	}
	return claims / length(phases).Seconds()
}

func peakRate(phases []phase) float64 {
	peak := 0.0
	for _, p := range phases {
		peak = max(peak, p.Rate)
	}
	return peak
}

func describe(phases []phase) string {
	s := ""
	for i, p := range phases {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %g/s for %gs", p.Name, p.Rate, p.Seconds)
	}
	return s
}
