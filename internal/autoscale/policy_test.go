package autoscale

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func spec() Spec {
	return Spec{MinReplicas: 1, MaxReplicas: 50, Target: 0.99, ScaleDownDelay: 2 * time.Minute,
		StableWindow: 60 * time.Second, PanicWindow: 6 * time.Second, StepInterval: 5 * time.Second}
}

// sim replays claims against Arrivals and a Policy on an injected clock,
// deciding every tick as the pool controller's requeue does.
type sim struct {
	t        *testing.T
	now      time.Time
	arrivals *Arrivals
	policy   Policy
	spec     Spec
	startup  time.Duration
	rng      *rand.Rand
	current  int32 // the stored replicas: every decision is written
}

func newSim(t *testing.T, s Spec, startup time.Duration) *sim {
	return &sim{t: t, now: time.Unix(1_700_000_000, 0), arrivals: NewArrivals(s.StableWindow), spec: s,
		startup: startup, rng: rand.New(rand.NewPCG(1, 2))}
}

// run advances d in steps of tick with Poisson arrivals at rate, deciding
// after each step, and returns the last decision.
func (s *sim) run(d, tick time.Duration, rate float64) Decision {
	var dec Decision
	for end := s.now.Add(d); s.now.Before(end); {
		// Arrivals of one tick: exponential gaps.
		for t := s.rng.ExpFloat64() / rate; rate > 0 && t < tick.Seconds(); t += s.rng.ExpFloat64() / rate {
			s.arrivals.Add(s.now.Add(time.Duration(t*float64(time.Second))), 1)
		}
		s.now = s.now.Add(tick)
		dec = s.decide()
	}
	return dec
}

func (s *sim) decide() Decision {
	d := s.policy.Decide(s.spec, Demand{Now: s.now, StableRate: s.arrivals.Rate(s.now, s.spec.StableWindow),
		PanicRate: s.arrivals.Rate(s.now, s.spec.PanicWindow), Startup: s.startup, Current: s.current})
	s.current = d.Replicas
	return d
}

func TestSteadyDemandKeepsThePoissonQuantile(t *testing.T) {
	s := newSim(t, spec(), 2*time.Second)
	s.arrivals.Add(s.now, 0)
	// 1 claim/s and 2 s starts: 2 claims per start-up on average; 6 pods
	// cover them 99% of the time (P(X<=6) = 0.9955 for Poisson(2)).
	dec := s.run(10*time.Minute, 5*time.Second, 1)
	if dec.Replicas < 5 || dec.Replicas > 8 {
		t.Fatalf("steady 1/s with 2 s starts: %+v", dec)
	}
	if !strings.Contains(dec.Message, "99% quantile") {
		t.Fatalf("message: %s", dec.Message)
	}
	// The same demand with 10 s starts needs more warm pods.
	s.startup = 10 * time.Second
	if dec := s.run(time.Minute, 5*time.Second, 1); dec.Replicas < 14 || dec.Replicas > 22 {
		t.Fatalf("steady 1/s with 10 s starts: %+v", dec)
	}
}

func TestBurstScalesUpWithinOneDecisionAndComesDownAfterTheDelay(t *testing.T) {
	s := newSim(t, spec(), 2*time.Second)
	s.arrivals.Add(s.now, 0)
	base := s.run(5*time.Minute, 5*time.Second, 0.2)
	// A burst of 60 claims within a second: the next decision plans for the
	// short window's rate.
	s.now = s.now.Add(time.Second)
	s.arrivals.Add(s.now, 60)
	burst := s.decide()
	if burst.Reason != ReasonBurst || burst.Replicas < 20 || burst.Replicas <= base.Replicas {
		t.Fatalf("after a burst (base %d): %+v", base.Replicas, burst)
	}
	// Quiet at the base rate again: held for the delay...
	held := s.run(spec().ScaleDownDelay-10*time.Second, 5*time.Second, 0.2)
	if held.Replicas != burst.Replicas || held.Reason != ReasonScaleDownDelay {
		t.Fatalf("within the scale-down delay: %+v (burst %d)", held, burst.Replicas)
	}
	// ...then down in steps of at most half, to the base again.
	var steps []int32
	last := held.Replicas
	for range 20 {
		d := s.run(5*time.Second, 5*time.Second, 0.2)
		if d.Replicas < last/2 {
			t.Fatalf("dropped from %d to %d in one step", last, d.Replicas)
		}
		if d.Replicas != last {
			steps = append(steps, d.Replicas)
		}
		last = d.Replicas
	}
	if last > base.Replicas+1 || len(steps) < 2 {
		t.Fatalf("after the delay: steps %v, base %d", steps, base.Replicas)
	}
}

func TestCappedByMaxReplicasSaysSo(t *testing.T) {
	sp := spec()
	sp.MaxReplicas = 4
	s := newSim(t, sp, 5*time.Second)
	s.arrivals.Add(s.now, 0)
	dec := s.run(2*time.Minute, 5*time.Second, 3)
	if dec.Replicas != 4 || dec.Reason != ReasonMaxReplicas || !dec.Capped() || dec.Wanted <= 4 {
		t.Fatalf("capped pool: %+v", dec)
	}
	if !strings.Contains(dec.Message, "capped at maxReplicas 4") {
		t.Fatalf("message: %s", dec.Message)
	}
}

func TestScaleToZeroAfterTheDelay(t *testing.T) {
	sp := spec()
	sp.MinReplicas = 0
	s := newSim(t, sp, 2*time.Second)
	s.arrivals.Add(s.now, 0)
	busy := s.run(3*time.Minute, 5*time.Second, 0.5)
	if busy.Replicas == 0 {
		t.Fatalf("busy pool at zero: %+v", busy)
	}
	// No claims: the long window empties after a minute, the delay holds
	// two more, then the steps reach zero.
	dec := s.run(sp.StableWindow+sp.ScaleDownDelay+time.Minute, 5*time.Second, 0)
	if dec.Replicas != 0 || dec.Reason != ReasonIdle {
		t.Fatalf("idle pool with minReplicas 0: %+v", dec)
	}
	// The first claim after idle pays a cold start (the pool controller
	// starts a pod for it); the next decision keeps one warm.
	s.now = s.now.Add(time.Second)
	s.arrivals.Add(s.now, 1)
	if dec := s.decide(); dec.Replicas != 1 || dec.Reason != ReasonDemand {
		t.Fatalf("first claim after idle: %+v", dec)
	}
}

func TestMinReplicasHolds(t *testing.T) {
	sp := spec()
	sp.MinReplicas = 3
	s := newSim(t, sp, time.Second)
	s.arrivals.Add(s.now, 0)
	if dec := s.run(5*time.Minute, 5*time.Second, 0); dec.Replicas != 3 {
		t.Fatalf("no demand, minReplicas 3: %+v", dec)
	}
	if dec := s.run(time.Minute, 5*time.Second, 0.01); dec.Replicas != 3 || dec.Reason != ReasonMinReplicas {
		t.Fatalf("little demand, minReplicas 3: %+v", dec)
	}
}

// A restarted manager has no record: the pool's replicas hold for the
// scale-down delay before the (empty) demand shrinks them.
func TestSeededPolicyHoldsTheReplicasItFound(t *testing.T) {
	s := newSim(t, spec(), 2*time.Second)
	s.policy.Seed(s.now, 12)
	s.current = 12
	if d := s.run(spec().ScaleDownDelay-10*time.Second, 5*time.Second, 0); d.Replicas != 12 || d.Reason != ReasonScaleDownDelay {
		t.Fatalf("within the delay after a restart: %+v", d)
	}
	if d := s.run(20*time.Second, 5*time.Second, 0); d.Replicas >= 12 {
		t.Fatalf("after the delay: %+v", d)
	}
}

// Every write of the replicas wakes another decision at once: the steps
// down still come one per StepInterval, each halving at most what is stored.
func TestScaleDownStepsOnePerInterval(t *testing.T) {
	s := newSim(t, spec(), 2*time.Second)
	s.policy.Seed(s.now, 40)
	s.current = 40
	s.now = s.now.Add(spec().ScaleDownDelay + time.Second) // the delay is over and there is no demand
	var seen []int32
	for range 10 { // ten decisions within one second
		seen = append(seen, s.decide().Replicas)
		s.now = s.now.Add(100 * time.Millisecond)
	}
	if seen[0] != 20 || seen[9] != 20 {
		t.Fatalf("decisions within one interval: %v, want one step to 20", seen)
	}
	s.now = s.now.Add(spec().StepInterval)
	if d := s.decide(); d.Replicas != 10 || d.Reason != ReasonScaleDownStep {
		t.Fatalf("next interval: %+v", d)
	}
	// The write of 10 failed: the store still says 20, and the next step
	// halves that, not the 10 never stored.
	s.now = s.now.Add(spec().StepInterval)
	s.current = 20
	if d := s.decide(); d.Replicas != 10 {
		t.Fatalf("step from the stored value: %+v", d)
	}
}
