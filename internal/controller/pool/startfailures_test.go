package pool

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func failedPod(name, hash, message string) corev1.Pod {
	p := wrappers.Pod("ns", name, "python").TemplateHash(hash).NotReady().Obj()
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: message}}}}
	return *p
}

func TestStartFailuresBackOffAndSayWhy(t *testing.T) {
	var s startFailures
	pool := types.NamespacedName{Namespace: "ns", Name: "python"}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	if d, msg := s.wait(pool, now); d != 0 || msg != "" {
		t.Fatalf("nothing failed yet: %s %q", d, msg)
	}
	reason := "interpreter 0 cannot start: preload failed: numpy: ModuleNotFoundError: No module named 'numpy'"
	pods := []corev1.Pod{failedPod("p1", "h", reason)}
	s.observe(pool, "h", pods, now, fine)
	s.observe(pool, "h", pods, now.Add(100*time.Millisecond), fine) // the same pod again counts once
	d, msg := s.wait(pool, now)
	if d != time.Second || !strings.Contains(msg, "No module named 'numpy'") || !strings.Contains(msg, "1 pod(s)") {
		t.Fatalf("after one failure: %s %q", d, msg)
	}
	for i, name := range []string{"p2", "p3", "p4"} {
		pods = append(pods, failedPod(name, "h", reason))
		s.observe(pool, "h", pods, now.Add(time.Duration(i+1)*time.Minute), fine)
	}
	if d, _ := s.wait(pool, now.Add(3*time.Minute)); d != 8*time.Second {
		t.Fatalf("after four failures wait %s, want 8s", d)
	}
	// A pod of another (older) template failing does not count; a new template starts afresh.
	s.observe(pool, "h2", pods, now.Add(4*time.Minute), fine)
	if d, msg := s.wait(pool, now.Add(4*time.Minute)); d != 0 || msg != "" {
		t.Fatalf("new template: %s %q", d, msg)
	}
	// A Ready pod of the current template clears the record.
	s.observe(pool, "h2", []corev1.Pod{failedPod("q1", "h2", reason)}, now.Add(5*time.Minute), fine)
	s.observe(pool, "h2", []corev1.Pod{*wrappers.Pod("ns", "q2", "python").TemplateHash("h2").Obj()}, now.Add(6*time.Minute), fine)
	if d, msg := s.wait(pool, now.Add(6*time.Minute)); d != 0 || msg != "" {
		t.Fatalf("after a Ready pod: %s %q", d, msg)
	}
}

func fine(*corev1.Pod) string { return "" }

// A Ready pod whose agent the manager cannot call is a failed start: its
// replacement, of the same image, would be the same, so the pool backs off.
func TestStartFailuresCountReadyPodsOfNoUse(t *testing.T) {
	var s startFailures
	pool := types.NamespacedName{Namespace: "ns", Name: "python"}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	unsupported := func(*corev1.Pod) string { return "its agent speaks protocol 7" }
	p1 := *wrappers.Pod("ns", "p1", "python").TemplateHash("h").Obj()
	s.observe(pool, "h", []corev1.Pod{p1}, now, unsupported)
	s.observe(pool, "h", []corev1.Pod{p1}, now, unsupported)
	if d, msg := s.wait(pool, now); d != time.Second || !strings.Contains(msg, "pod p1: its agent speaks protocol 7") || !strings.Contains(msg, "1 pod(s)") {
		t.Fatalf("after one pod of no use: %s %q", d, msg)
	}
	p2 := *wrappers.Pod("ns", "p2", "python").TemplateHash("h").Obj()
	s.observe(pool, "h", []corev1.Pod{p2}, now.Add(time.Second), unsupported)
	if d, _ := s.wait(pool, now.Add(time.Second)); d != 2*time.Second {
		t.Fatalf("after two: wait %s, want 2s", d)
	}
	// Its Readiness did not clear the record; a usable Ready pod does.
	s.observe(pool, "h", []corev1.Pod{p2}, now.Add(3*time.Second), fine)
	if d, msg := s.wait(pool, now.Add(3*time.Second)); d != 0 || msg != "" {
		t.Fatalf("a usable Ready pod clears the record: %s %q", d, msg)
	}
}
