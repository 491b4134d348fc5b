// Package autoscale sizes a warm pool from its demand: the arrival rate of
// claims over a long and a short window, and how long the pool's pods take
// to start. It keeps enough unclaimed pods to cover, with the target
// probability, the claims that arrive during one start-up time (the claims
// a replacement pod cannot serve in time), scales up at once when a burst
// shows in the short window, and scales down only after a delay and in
// bounded steps. The pool controller adds one pod per claim already
// waiting, as it does for a fixed pool.
package autoscale

import (
	"fmt"
	"time"
)

// Spec is what a pool asks of its autoscaler.
type Spec struct {
	MinReplicas, MaxReplicas int32
	// Target is the probability that the claims arriving during one
	// start-up time all find a warm pod, in (0, 1).
	Target float64
	// ScaleDownDelay is how long demand must stay lower before the pool
	// shrinks: the largest recommendation of that span holds.
	ScaleDownDelay time.Duration
	// StepInterval is the least time between two scale-down steps: every
	// write of the replicas wakes another decision at once, and without it
	// the halving steps would follow each other within a second.
	StepInterval time.Duration
	// StableWindow and PanicWindow are the long and short windows of the
	// arrival rate (60 s and 6 s, as Knative's).
	StableWindow, PanicWindow time.Duration
}

// Demand is what the pool saw up to Now.
type Demand struct {
	Now time.Time
	// StableRate and PanicRate are claims per second over the long and the
	// short window.
	StableRate, PanicRate float64
	// Startup is the start-up time to plan for.
	Startup time.Duration
	// Current is the replicas the pool has stored: a scale-down step
	// halves it at most, whatever the policy decided before (a decision
	// whose write failed was never stored).
	Current int32
}

// Reasons of a Decision, for the pool's status.
const (
	ReasonDemand         = "Demand"         // the quantile of the expected claims
	ReasonBurst          = "Burst"          // the short window's rate, higher than the long one's
	ReasonScaleDownDelay = "ScaleDownDelay" // held at a recent, higher recommendation
	ReasonScaleDownStep  = "ScaleDownStep"  // shrinking, by at most half (rounded up) at a time
	ReasonMinReplicas    = "MinReplicas"
	ReasonMaxReplicas    = "MaxReplicas" // demand asks for more than autoscaling.maxReplicas
	ReasonMaxPods        = "MaxPods"     // demand asks for more than spec.maxPods (set by the caller)
	ReasonIdle           = "Idle"        // no claims in the long window: scaled to the minimum
)

// Decision is the number of unclaimed pods to keep and why.
type Decision struct {
	Replicas int32
	// Wanted is what demand alone asks for (before the delay, the step and
	// the bounds): above Replicas when the pool is capped.
	Wanted int32
	Rate   float64 // the claims per second planned for
	Reason string
	// Message says it in words a person can check.
	Message string
}

// Capped says whether demand asks for more than the pool may have.
func (d Decision) Capped() bool { return d.Wanted > d.Replicas }

// burstSurprise is how unlikely, at the long window's rate, the short
// window's count must be to count as a burst. Lower would chase the noise
// of a steady Poisson stream (each false burst holds extra pods for the
// scale-down delay); higher would wait for bursts to be larger.
const burstSurprise = 1e-3

// burst says whether the short window holds more claims than the long
// window's rate makes plausible: demand has changed, and the pool plans for
// the short window's rate at once.
func burst(spec Spec, d Demand) bool {
	if d.PanicRate <= d.StableRate {
		return false
	}
	secs := spec.PanicWindow.Seconds()
	return d.PanicRate*secs > float64(PoissonQuantile(d.StableRate*secs, 1-burstSurprise))
}

// recommendation is one past Wanted, kept for the scale-down delay.
type recommendation struct {
	at time.Time
	n  int32
}

// Policy is the autoscaler of one pool: its past recommendations and last
// decision. Not safe for concurrent use.
type Policy struct {
	history  []recommendation
	lastStep time.Time // the last scale-down
}

// Seed starts a policy that has no past (a restarted manager) from the
// replicas the pool has: they count as a recommendation made at now, so the
// pool is not shrunk before the scale-down delay on an empty record.
func (p *Policy) Seed(now time.Time, replicas int32) {
	p.history = append(p.history[:0], recommendation{at: now, n: replicas})
}

// Decide returns the replicas for demand d.
func (p *Policy) Decide(spec Spec, d Demand) Decision {
	rate, reason := d.StableRate, ReasonDemand
	if burst(spec, d) {
		rate, reason = d.PanicRate, ReasonBurst
	}
	expected := rate * d.Startup.Seconds()
	wanted := int32(min(PoissonQuantile(expected, spec.Target), 1<<30))
	if rate == 0 {
		reason = ReasonIdle
	}
	msg := fmt.Sprintf("%.3g claims/s (%.3g/s over %s, %.3g/s over %s) × start-up %s = %.3g claims per start-up; %g%% quantile %d",
		rate, d.StableRate, spec.StableWindow, d.PanicRate, spec.PanicWindow, d.Startup.Round(10*time.Millisecond),
		expected, spec.Target*100, wanted)

	// The largest recommendation of the last ScaleDownDelay holds.
	p.history = append(p.history, recommendation{at: d.Now, n: wanted})
	held := wanted
	keep := p.history[:0]
	for _, r := range p.history {
		if d.Now.Sub(r.at) < spec.ScaleDownDelay || r.at.Equal(d.Now) {
			keep = append(keep, r)
			held = max(held, r.n)
		}
	}
	p.history = keep
	n := wanted
	if held > n {
		n, reason = held, ReasonScaleDownDelay
		msg += fmt.Sprintf("; held at %d, the most asked for in the last %s", held, spec.ScaleDownDelay)
	}
	// Shrink by at most half (rounded up) of what is stored, one step per
	// StepInterval: a lull that ends is not met by an empty pool.
	if n < d.Current {
		switch {
		case d.Now.Sub(p.lastStep) < spec.StepInterval:
			n, reason = d.Current, ReasonScaleDownStep
			msg += fmt.Sprintf("; held at %d until %s after the last step down", d.Current, spec.StepInterval)
		case n < d.Current/2:
			n, reason = d.Current/2, ReasonScaleDownStep
			msg += fmt.Sprintf("; down from %d by at most half", d.Current)
		}
		if n < d.Current {
			p.lastStep = d.Now
		}
	}
	switch {
	case n > spec.MaxReplicas:
		n, reason = spec.MaxReplicas, ReasonMaxReplicas
		msg += fmt.Sprintf("; capped at maxReplicas %d", spec.MaxReplicas)
	case n < spec.MinReplicas:
		n = spec.MinReplicas
		if reason != ReasonIdle {
			reason = ReasonMinReplicas
		}
		msg += fmt.Sprintf("; raised to minReplicas %d", spec.MinReplicas)
	}
	return Decision{Replicas: n, Wanted: wanted, Rate: rate, Reason: reason, Message: msg}
}
