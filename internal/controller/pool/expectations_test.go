package pool

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestExpectationsHoldUntilTheCacheCatchesUp(t *testing.T) {
	e := newExpectations(time.Now)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	now := time.Now()
	e.Created(pool, "p-a")
	e.Created(pool, "p-b")
	e.Deleted(pool, "p-old")

	creates, deleting := e.Observe(pool, map[string]bool{"p-old": false}, now)
	if creates != 2 || !deleting["p-old"] {
		t.Fatalf("lagging cache: creates=%d deleting=%v", creates, deleting)
	}
	creates, deleting = e.Observe(pool, map[string]bool{"p-a": false, "p-old": true}, now)
	if creates != 1 || len(deleting) != 0 {
		t.Fatalf("cache saw p-a and p-old terminating: creates=%d deleting=%v", creates, deleting)
	}
	creates, _ = e.Observe(pool, map[string]bool{}, now.Add(2*expectationTTL))
	if creates != 0 {
		t.Fatalf("expired expectation still pending: %d", creates)
	}
}
