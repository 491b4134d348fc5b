package dataplane

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stoppedSpend is a spend whose clock stands still: a bucket refills only
// when the test moves the clock.
func stoppedSpend(perSecond float64, burst int, wait time.Duration) (*spend, *time.Time) {
	s := newSpend(perSecond, burst, wait)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	return s, &now
}

// A namespace that has spent its bucket is refused with when its turn comes;
// another namespace is served at once; the bucket refills with time.
func TestANamespaceThatSpentItsRateWaitsAndAnotherDoesNot(t *testing.T) {
	s, now := stoppedSpend(2, 3, 100*time.Millisecond)
	ctx := context.Background()
	for i := range 3 {
		if err := s.pay(ctx, "a"); err != nil {
			t.Fatalf("a's request %d of its burst of 3: %v", i+1, err)
		}
	}
	var r *refusal
	if err := s.pay(ctx, "a"); !errors.As(err, &r) {
		t.Fatalf("a's fourth request, its turn 500 ms off and the wait 100 ms: got %v, want a refusal", err)
	}
	if r.retryAfter != 500*time.Millisecond || !strings.Contains(r.msg, "namespace a has spent") {
		t.Fatalf("the refusal must say when a's turn comes (500 ms at 2 a second): %+v", r)
	}
	if err := s.pay(ctx, "b"); err != nil {
		t.Fatalf("b has a bucket of its own: %v", err)
	}
	*now = now.Add(500 * time.Millisecond)
	if err := s.pay(ctx, "a"); err != nil {
		t.Fatalf("a's bucket has refilled one token after 500 ms: %v", err)
	}
	if err := s.pay(ctx, "a"); !errors.As(err, &r) {
		t.Fatalf("and only one: got %v", err)
	}
}

// A request that moved many bytes leaves a debt its namespace's next
// requests wait off: a flood of large outputs spends faster than one of
// print(1).
func TestBytesMovedAreBilledToTheNamespace(t *testing.T) {
	s, _ := stoppedSpend(1, 20, time.Millisecond)
	ctx := context.Background()
	if err := s.pay(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	s.charge("a", 10*spendBytesPerToken+100) // ten more tokens
	for i := range 9 {
		if err := s.pay(ctx, "a"); err != nil {
			t.Fatalf("request %d of the 9 tokens left: %v", i+1, err)
		}
	}
	var r *refusal
	if err := s.pay(ctx, "a"); !errors.As(err, &r) {
		t.Fatalf("the bucket is spent (1 + 10 + 9 of 20): got %v", err)
	}
	s.charge("b", spendBytesPerToken-1) // less than a token's worth: the first token paid for it
	for i := range 20 {
		if err := s.pay(ctx, "b"); err != nil {
			t.Fatalf("b's request %d: %v", i+1, err)
		}
	}
}

// A turn that comes within the queue's wait is waited for, and a caller that
// goes away meanwhile gives its turn back.
func TestATurnWithinTheWaitIsWaitedFor(t *testing.T) {
	s := newSpend(20, 1, time.Minute)
	ctx := context.Background()
	if err := s.pay(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.pay(ctx, "a"); err != nil {
		t.Fatalf("a turn 50 ms off, the wait a minute: %v", err)
	}
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Fatalf("the second request of a bucket of one at 20 a second was served after %s, without its turn", waited)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.pay(gone, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that went away: got %v", err)
	}
}

// Through the server: a spent namespace's run is answered 429 with the
// Retry-After of its turn, and gives its seat back; interrupts and bridge
// answers spend nothing.
func TestASpentNamespaceIsAnswered429WithItsTurn(t *testing.T) {
	sp, _ := stoppedSpend(0.25, 1, time.Second)
	s := &Server{seats: newSeats(1, 1, time.Minute), spend: sp}
	serve := func(sub string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		req.SetPathValue("namespace", "a")
		s.instrumented(sub, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })(rec, req)
		return rec
	}
	if rec := serve(SubExec); rec.Code != http.StatusOK {
		t.Fatalf("a's first run: %d", rec.Code)
	}
	rec := serve(SubExec)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a's second run, its turn 4 s off: %d %s", rec.Code, rec.Body)
	}
	if ra, _ := strconv.Atoi(rec.Header().Get("Retry-After")); ra != 4 {
		t.Fatalf("Retry-After %q, want 4 (one token at 0.25 a second)", rec.Header().Get("Retry-After"))
	}
	for _, sub := range []string{SubInterrupt, SubBridge} {
		if rec := serve(sub); rec.Code != http.StatusOK {
			t.Fatalf("%s of a spent namespace: %d, want 200", sub, rec.Code)
		}
	}
	expectNoneHeld(t, s.seats)
}
