package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func queued(name string, created int, session string, phase sandboxv1alpha1.ExecutionPhase) sandboxv1alpha1.Execution {
	ex := wrappers.Execution("ns", name).Session(session).Obj()
	ex.UID = types.UID(name)
	ex.CreationTimestamp = metav1.NewTime(time.Unix(1000+int64(created), 0))
	ex.Status.Phase = phase
	return *ex
}

func names(q []*sandboxv1alpha1.Execution) []string {
	var out []string
	for _, ex := range q {
		out = append(out, ex.Name)
	}
	return out
}

func TestQueueIsFIFOWithOneEntryPerSession(t *testing.T) {
	all := []sandboxv1alpha1.Execution{
		queued("c", 3, "", sandboxv1alpha1.PhasePending),
		queued("a", 1, "", ""),
		queued("s2", 5, "notebook", sandboxv1alpha1.PhasePending),
		queued("s1", 2, "notebook", sandboxv1alpha1.PhasePending),
		queued("done", 0, "", sandboxv1alpha1.PhaseSucceeded),
		queued("b", 1, "", sandboxv1alpha1.PhasePending), // same time as a: name decides
		queued("r", 0, "busy", sandboxv1alpha1.PhaseRunning),
		queued("r2", 0, "busy", sandboxv1alpha1.PhasePending),
		queued("h", 4, "haspod", sandboxv1alpha1.PhasePending),
	}
	q := queue(all, func(s string) bool { return s == "haspod" })
	got := names(q)
	want := []string{"a", "b", "s1", "c"}
	if len(got) != len(want) {
		t.Fatalf("queue = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("queue = %v, want %v", got, want)
		}
	}
	if position(q, &all[0]) != 3 || position(q, &all[2]) != -1 {
		t.Fatalf("positions: c=%d s2=%d", position(q, &all[0]), position(q, &all[2]))
	}
	if !firstOfSession(all, &all[3]) || firstOfSession(all, &all[2]) || firstOfSession(all, &all[7]) {
		t.Fatal("firstOfSession: s1 goes first; s2 waits for s1; r2 waits for the running r")
	}
	cancelled := queued("x", 0, "", sandboxv1alpha1.PhasePending)
	cancelled.Spec.Cancel = true
	if len(queue([]sandboxv1alpha1.Execution{cancelled}, func(string) bool { return false })) != 0 {
		t.Fatal("a cancelled Execution must not hold a place in the queue")
	}
}
