package dataplane

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

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
	got := make(chan error, 1)
	go func() {
		release, err := s.take(context.Background(), "a")
		if err == nil {
			defer release()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("a's third request was served past its 2 seats (%v)", err)
	default:
	}
	b := mustTake(t, s, "b") // at once: b has seats of its own
	b()
	a1()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a's waiter did not get the seat a1 gave back")
	}
	a2()
	if len(s.ns) != 0 {
		t.Fatalf("seats left held: %+v", s.ns)
	}
}

func TestAFullQueueAndALongWaitAreRefused(t *testing.T) {
	s := newSeats(1, 1, 50*time.Millisecond)
	release := mustTake(t, s, "a")
	waited := make(chan error, 1)
	go func() { _, err := s.take(context.Background(), "a"); waited <- err }()
	time.Sleep(10 * time.Millisecond)
	var r *refusal
	if _, err := s.take(context.Background(), "a"); !errors.As(err, &r) {
		t.Fatalf("a request past a full queue: got %v, want a refusal", err)
	}
	if err := <-waited; !errors.As(err, &r) {
		t.Fatalf("a request that waited past the queue's wait: got %v, want a refusal", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, err := s.take(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that went away: got %v", err)
	}
	release()
	if len(s.ns) != 0 {
		t.Fatalf("seats left held: %+v", s.ns)
	}
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
	time.Sleep(20 * time.Millisecond)
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
