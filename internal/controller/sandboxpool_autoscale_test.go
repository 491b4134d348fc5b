package controller_test

import (
	"fmt"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/autoscale"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The suite's managers use a 10 s claim-rate window (a 1 s burst window).
// The spec freezes the autoscaler's clock: the claims stay in the window
// however slowly the machine runs the burst, and the delay passes on the
// clock's steps, not on the wall clock.
var _ = Describe("SandboxPool autoscaling", func() {
	It("scales up within one reconcile of a burst, says why, and comes back down only after the delay", func() {
		ns := newNamespace()
		// Longer than the suite's 10 s rate window: without the delay the
		// pool would shrink as soon as the burst left the window.
		const delay = 15 * time.Second
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Autoscaling(1, 6, delay).Obj())
		replicas := func() int32 { return getPool(ns, "python").Spec.Replicas }

		// Quiet: the autoscaler explains the minimum it keeps.
		Eventually(func() *sandboxv1alpha1.PoolAutoscalingStatus { return getPool(ns, "python").Status.Autoscaling }).
			Should(And(Not(BeNil()), HaveField("DesiredReplicas", BeEquivalentTo(1))))
		Expect(replicas()).To(BeEquivalentTo(1))

		// A burst of 12 Executions: the reconcile the burst wakes scales the
		// pool (the dispatcher's debounce, then one reconcile), capped by
		// maxReplicas, and the status shows the arithmetic.
		autoscaleClock.freeze()
		burstAt := autoscaleClock.Now()
		var burst []*sandboxv1alpha1.Execution
		for i := range 12 {
			ex := wrappers.Execution(ns, fmt.Sprintf("burst-%d", i)).Code("print(1)").Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			burst = append(burst, ex)
		}
		Eventually(replicas, 3*time.Second, 50*time.Millisecond).Should(BeEquivalentTo(6))
		Eventually(func() string { return getPool(ns, "python").Status.Autoscaling.Reason }).Should(Equal(autoscale.ReasonMaxReplicas))
		st := getPool(ns, "python").Status.Autoscaling
		Expect(st.Message).To(And(ContainSubstring("capped at maxReplicas 6"), ContainSubstring("quantile")))
		Expect(st.LastScaleTime).NotTo(BeNil())
		Expect(st.ClaimRate).NotTo(Equal("0.000"))
		Eventually(func() []string {
			var evs eventsv1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				if e.Regarding.Name == "python" {
					reasons = append(reasons, e.Reason)
				}
			}
			return reasons
		}).Should(ContainElements("Autoscaled", "AutoscalingCapped"))
		for _, ex := range burst {
			Expect(finished(ex).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		}
		// One pod was warm for twelve claims: most of them waited for a start.
		Eventually(func() float64 {
			ratio, err := strconv.ParseFloat(getPool(ns, "python").Status.Autoscaling.WarmHitRatio, 64)
			if err != nil {
				return -1
			}
			return ratio
		}).Should(And(BeNumerically(">", 0), BeNumerically("<", 1)))
		// The same ratio as a metric, for dashboards and alerts.
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.PoolWarmHitRatio.WithLabelValues(ns, "python"))
		}).Should(And(BeNumerically(">", 0), BeNumerically("<", 1)))
		Eventually(func() int { return idleReady(ns, "python") }).Should(BeNumerically(">=", 6))

		// Demand is gone: the pool holds its size while the burst is in the
		// rate window and for the delay after, then steps down to the
		// minimum. The clock moves a second at each look: the pool reconciles
		// every few (wall) seconds and sees a minute pass in a few of them.
		Consistently(replicas, 2*time.Second).Should(BeEquivalentTo(6), "the clock stands still: so does the pool")
		var downAt time.Time
		var steps []int32
		Eventually(func() int32 {
			now := autoscaleClock.step(time.Second)
			n := replicas()
			if n < 6 && downAt.IsZero() {
				downAt = now
			}
			if len(steps) == 0 || steps[len(steps)-1] != n {
				steps = append(steps, n)
			}
			return n
		}, 2*time.Minute, 100*time.Millisecond).Should(BeEquivalentTo(1))
		Expect(downAt.Sub(burstAt)).To(BeNumerically(">=", delay), "scaled down before the scale-down delay")
		Expect(steps).To(ContainElement(And(BeNumerically(">", 1), BeNumerically("<", 6))),
			"down in steps of at most half, not at once: %v", steps)
		Eventually(func() int { return len(poolPods(ns, "python")) }, 30*time.Second).Should(Equal(1))
	})

	It("rejects limits that contradict each other", func() {
		ns := newNamespace()
		err := k8s.Create(ctx, wrappers.Pool(ns, "python").Autoscaling(5, 2, time.Minute).Obj())
		Expect(err).To(MatchError(ContainSubstring("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")))
		bad := wrappers.Pool(ns, "python").Autoscaling(1, 2, time.Minute).Obj()
		bad.Spec.Autoscaling.TargetWarmRatio = "1.5"
		Expect(k8s.Create(ctx, bad)).To(MatchError(ContainSubstring("targetWarmRatio must be a decimal between 0 and 1")))
	})
})
