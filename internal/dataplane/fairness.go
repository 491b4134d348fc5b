package dataplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/warmpool/warmpool/internal/metrics"
)

// Per-namespace fairness, in the spirit of kube-apiserver's API Priority and
// Fairness: a namespace holds at most a number of this replica's requests at
// once (its seats); more wait in the namespace's own queue, first come first
// served, bounded in length and in time, and past either bound are refused
// 429 with Retry-After. One tenant's flood of runs, attaches, files or forks
// so waits in its own queue and takes no more than its seats, while another
// tenant's requests find seats of their own at once.
//
// Interrupts and bridge answers take no seat: they are how a run that holds
// one is stopped or goes on, and queueing them behind the runs they serve
// could stop a namespace for good.
const (
	// DefaultNamespaceSeats is what one namespace may hold of a replica's
	// requests at once. A run holds its seat while its code runs: this is
	// how many of one namespace's code blocks a replica runs at once.
	DefaultNamespaceSeats = 32
	// DefaultNamespaceQueue is how many of one namespace's requests may wait
	// for a seat; DefaultNamespaceQueueWait how long each may wait.
	DefaultNamespaceQueue     = 256
	DefaultNamespaceQueueWait = 30 * time.Second
	// queueRetryAfter is when a request its namespace's queue refused may
	// try again: a seat frees as any of the namespace's requests ends.
	queueRetryAfter = time.Second
)

// seats shares a replica's requests out among namespaces.
type seats struct {
	limit, queue int
	wait         time.Duration

	mu sync.Mutex
	ns map[string]*nsSeats
}

type nsSeats struct {
	held    int
	waiting []chan struct{} // closed when given a seat, first come first served
}

func newSeats(limit, queue int, wait time.Duration) *seats {
	return &seats{limit: limit, queue: queue, wait: wait, ns: map[string]*nsSeats{}}
}

// refusal is a request the namespace's queue would not take or hold, or its
// spend not pay for; retryAfter is when to try again (zero: queueRetryAfter).
type refusal struct {
	msg        string
	retryAfter time.Duration
}

func (e *refusal) Error() string { return e.msg }

// take gives the request a seat of namespace ns, waiting in its queue if it
// must; release gives it back. A nil seats (no limit) gives every request one.
func (s *seats) take(ctx context.Context, ns string) (release func(), err error) {
	if s == nil || s.limit <= 0 {
		return func() {}, nil
	}
	s.mu.Lock()
	q := s.ns[ns]
	if q == nil {
		q = &nsSeats{}
		s.ns[ns] = q
	}
	if q.held < s.limit && len(q.waiting) == 0 {
		q.held++
		s.mu.Unlock()
		return s.releaser(ns), nil
	}
	if len(q.waiting) >= s.queue {
		s.mu.Unlock()
		metrics.DataPlaneQueueRefused.WithLabelValues("queue_full").Inc()
		return nil, &refusal{msg: fmt.Sprintf("namespace %s has %d requests in this data-plane replica and %d waiting, its most: try again later", ns, s.limit, s.queue)}
	}
	ch := make(chan struct{})
	q.waiting = append(q.waiting, ch)
	s.mu.Unlock()
	start := time.Now()
	timer := time.NewTimer(s.wait)
	defer timer.Stop()
	select {
	case <-ch:
		metrics.DataPlaneQueueWait.Observe(time.Since(start).Seconds())
		return s.releaser(ns), nil
	case <-timer.C:
		err = &refusal{msg: fmt.Sprintf("namespace %s's requests waited %s for one of its %d seats in this data-plane replica: try again later", ns, s.wait, s.limit)}
		metrics.DataPlaneQueueRefused.WithLabelValues("waited").Inc()
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range q.waiting {
		if c == ch {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return nil, err
		}
	}
	// Given a seat as it gave up: give it on.
	s.giveLocked(ns, q)
	return nil, err
}

func (s *seats) releaser(ns string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.giveLocked(ns, s.ns[ns])
		})
	}
}

// giveLocked hands a freed seat to the namespace's first waiter, or frees it.
func (s *seats) giveLocked(ns string, q *nsSeats) {
	if len(q.waiting) > 0 {
		close(q.waiting[0])
		q.waiting = q.waiting[1:]
		return
	}
	if q.held--; q.held == 0 {
		delete(s.ns, ns)
	}
}

// seated runs h holding a seat of the request's namespace, paid for from the
// namespace's spend (spend.go), and bills it for the bytes h moved.
func (s *Server) seated(w *statusRecorder, r *http.Request, h http.HandlerFunc) {
	ns := r.PathValue("namespace")
	release, err := s.seats.take(r.Context(), ns)
	if err == nil {
		if err = s.spend.pay(r.Context(), ns); err != nil {
			release()
		}
	}
	if err != nil {
		var refused *refusal
		if errors.As(err, &refused) {
			tooMany(w, cmp.Or(refused.retryAfter, queueRetryAfter), refused.Error())
		}
		return // else the caller went away
	}
	defer release()
	body := &countingReader{ReadCloser: r.Body}
	r.Body = body
	before := w.written
	h(w, r)
	s.spend.charge(ns, body.n+w.written-before)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}
