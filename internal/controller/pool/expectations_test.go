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

// A pod created, leased, run and deleted between two reconciles never shows
// in a List: the informer's events settle its create, whichever comes first,
// the event or the create call's return.
func TestExpectationsSettledByTheInformersEvents(t *testing.T) {
	now := time.Now()
	e := newExpectations(func() time.Time { return now })
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	e.Created(pool, "p-gone")
	e.Seen(pool, "p-gone") // its deletion, before any List showed it
	e.Seen(pool, "p-fast") // its creation, before Create returned
	e.Created(pool, "p-fast")
	e.Created(pool, "p-slow")
	if creates, _ := e.Observe(pool, map[string]bool{}, now); creates != 1 {
		t.Fatalf("creates pending = %d, want 1 (p-slow only)", creates)
	}
	// A pod seen and never created by this manager is forgotten after the TTL.
	e.Seen(pool, "someone-elses")
	now = now.Add(2 * expectationTTL)
	e.Observe(pool, map[string]bool{}, now)
	e.Created(pool, "someone-elses")
	if creates, _ := e.Observe(pool, map[string]bool{}, now); creates != 1 {
		t.Fatalf("a stale sighting settled a new create: %d pending, want 1 (p-slow expired)", creates)
	}
}
