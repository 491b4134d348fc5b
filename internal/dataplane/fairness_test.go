package dataplane

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// waitQueued waits until n of namespace ns's requests wait for a seat.
func waitQueued(t *testing.T, s *seats, ns string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		q := s.ns[ns]
		got := 0
		if q != nil {
			got = len(q.waiting)
		}
		s.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: %d waiting, want %d", ns, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustTake(t *testing.T, s *seats, ns string) func() {
	t.Helper()
	release, err := s.take(context.Background(), ns)
	if err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	return release
}

// A namespace at its seats waits in its own queue; another namespace is
// served at once, and the waiter gets the first seat given back.
func TestAFloodingNamespaceWaitsInItsOwnQueue(t *testing.T) {
	s := newSeats(2, 4, time.Minute)
	a1, a2 := mustTake(t, s, "a"), mustTake(t, s, "a")
	got := make(chan func(), 1)
	go func() {
		release, err := s.take(context.Background(), "a")
		if err != nil {
			release = nil
		}
		got <- release
	}()
	waitQueued(t, s, "a", 1) // a's third request waits, past its 2 seats
	b := mustTake(t, s, "b") // at once: b has seats of its own
	b()
	a1()
	select {
	case a3 := <-got:
		if a3 == nil {
			t.Fatal("a's waiter was refused")
		}
		a3()
	case <-time.After(5 * time.Second):
		t.Fatal("a's waiter did not get the seat a1 gave back")
	}
	a2()
	expectNoneHeld(t, s)
}

func expectNoneHeld(t *testing.T, s *seats) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ns) != 0 {
		t.Fatalf("seats left held: %+v", s.ns)
	}
}

func TestAFullQueueAndALongWaitAreRefused(t *testing.T) {
	s := newSeats(1, 1, 50*time.Millisecond)
	release := mustTake(t, s, "a")
	waited := make(chan error, 1)
	go func() { _, err := s.take(context.Background(), "a"); waited <- err }()
	waitQueued(t, s, "a", 1)
	var r *refusal
	if _, err := s.take(context.Background(), "a"); !errors.As(err, &r) {
		t.Fatalf("a request past a full queue: got %v, want a refusal", err)
	}
	if err := <-waited; !errors.As(err, &r) {
		t.Fatalf("a request that waited past the queue's wait: got %v, want a refusal", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { waitQueued(t, s, "a", 1); cancel() }()
	if _, err := s.take(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that went away: got %v", err)
	}
	release()
	expectNoneHeld(t, s)
}

// Interrupts and bridge answers never wait for a seat: they are how the
// runs holding the seats stop or go on.
func TestInterruptsAndBridgeAnswersTakeNoSeat(t *testing.T) {
	s := &Server{seats: newSeats(1, 1, time.Minute)}
	hold := mustTake(t, s.seats, "a")
	defer hold()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = s.seats.take(ctx, "a") }() // fills a's queue
	waitQueued(t, s.seats, "a", 1)
	for sub, want := range map[string]int{SubInterrupt: http.StatusOK, SubBridge: http.StatusOK, SubExec: http.StatusTooManyRequests} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.SetPathValue("namespace", "a")
		s.instrumented(sub, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })(rec, req)
		if rec.Code != want {
			t.Errorf("%s with the namespace's seats taken: %d, want %d", sub, rec.Code, want)
		}
		if want == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s: a 429 without Retry-After", sub)
		}
	}
}
