package sandboxpod

import (
	"testing"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// A warm pod is probed quickly until it starts and rarely afterwards, and a
// probe or two that time out on a starved node do not make it not-Ready.
func TestProbesAreFastToStartAndCheapAndTolerantOnceStarted(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	pool.Namespace, pool.Name = "ns", "python"
	pool.Spec.Image = "warmpool.dev/repl:dev"
	pod := New(pool, AgentKey{ID: "k1", Trusted: "k1=AAAA"})
	c := pod.Spec.Containers[0]
	if c.StartupProbe == nil || c.StartupProbe.PeriodSeconds != 1 || c.StartupProbe.HTTPGet.Path != "/v1/readyz" {
		t.Fatalf("startup probe: want /v1/readyz every second, got %+v", c.StartupProbe)
	}
	if got := c.StartupProbe.PeriodSeconds * c.StartupProbe.FailureThreshold; got < 300 {
		t.Errorf("a pod may take only %ds to start: preloads under gVisor take longer", got)
	}
	for name, p := range map[string]struct{ period, failures, timeout int32 }{
		"readiness": {c.ReadinessProbe.PeriodSeconds, c.ReadinessProbe.FailureThreshold, c.ReadinessProbe.TimeoutSeconds},
		"liveness":  {c.LivenessProbe.PeriodSeconds, c.LivenessProbe.FailureThreshold, c.LivenessProbe.TimeoutSeconds},
	} {
		if p.period < 10 {
			t.Errorf("%s probe every %ds: an idle sandbox pays for each", name, p.period)
		}
		if p.failures < 3 || p.timeout < 5 {
			t.Errorf("%s probe gives up after %d failures of %ds: a starved node flaps its pods", name, p.failures, p.timeout)
		}
	}
}
