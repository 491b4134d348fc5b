package execution

import (
	"testing"
	"time"
)

func TestReconcilerDeadline(t *testing.T) {
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	timeout, grace := 30*time.Second, 5*time.Second
	// 30 s timeout + 5 s grace + 3 s slack + 6 s late.
	if got, want := reconcilerDeadline(start, time.Time{}, timeout, grace), start.Add(44*time.Second); !got.Equal(want) {
		t.Errorf("not tracked: %s, want %s", got, want)
	}
	if got, want := reconcilerDeadline(start, start.Add(time.Second), timeout, grace), start.Add(44*time.Second); !got.Equal(want) {
		t.Errorf("started at once: %s, want %s", got, want)
	}
	// Re-attached ten minutes later (a long failover): the agent gets grace + slack + late from then.
	back := start.Add(10 * time.Minute)
	if got, want := reconcilerDeadline(start, back, timeout, grace), back.Add(14*time.Second); !got.Equal(want) {
		t.Errorf("re-attached late: %s, want %s", got, want)
	}
}
