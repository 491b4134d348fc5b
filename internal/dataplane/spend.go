package dataplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/warmpool/warmpool/internal/metrics"
)

// Per-namespace spend. Seats (fairness.go) bound how many of a namespace's
// requests a replica serves at once; they do not bound what a flood of short
// ones costs. Two seats of print('x') runs, back to back, kept a 2-core
// node's kube-apiserver, data plane and sandboxes busy (128 runs a second),
// and another tenant's run then waited for CPU where no queue of ours can
// order the wait (docs/reliability.md). So a namespace also spends from a
// bucket of tokens per replica, refilled at a rate: a request costs one token
// as it starts, and one more for each 64 KiB it moved in or out, charged as
// it ends (a debt the namespace's next requests wait off). A request the
// bucket cannot pay for waits its turn holding its seat, at most the queue's
// wait; past that it is refused 429 with the Retry-After its turn would take.
const (
	// DefaultNamespaceRate is the tokens a second one namespace gets in a
	// replica; DefaultNamespaceBurst how many it may save up. A run of
	// print-sized output costs one. 50 a second in each of two replicas is
	// far above what a tenant's agents and people send, and halves what one
	// flooding tenant took on the local cluster (up to 174 runs a second); a
	// node with less to spare sets less: 20 kept another tenant's p99 at its
	// own on a 2-core node that also ran the control plane
	// (docs/reliability.md).
	DefaultNamespaceRate  = 50
	DefaultNamespaceBurst = 100
	// spendBytesPerToken: the bytes of a request and its answer one more
	// token pays for.
	spendBytesPerToken = 64 << 10
	// spendIdle is how long a namespace's bucket stays after its last
	// request; a bucket that is gone starts full, as an idle one would be.
	spendIdle = time.Minute
)

// spend holds the namespaces' buckets of one replica.
type spend struct {
	rate  rate.Limit
	burst int
	wait  time.Duration
	now   func() time.Time

	mu        sync.Mutex
	ns        map[string]*nsSpend
	lastSweep time.Time
}

type nsSpend struct {
	lim  *rate.Limiter
	used time.Time
}

func newSpend(perSecond float64, burst int, wait time.Duration) *spend {
	return &spend{rate: rate.Limit(perSecond), burst: max(1, burst), wait: wait, now: time.Now, ns: map[string]*nsSpend{}}
}

func (s *spend) bucket(ns string) *rate.Limiter {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.lastSweep) > spendIdle {
		for k, b := range s.ns {
			if now.Sub(b.used) > spendIdle {
				delete(s.ns, k)
			}
		}
		s.lastSweep = now
	}
	b := s.ns[ns]
	if b == nil {
		b = &nsSpend{lim: rate.NewLimiter(s.rate, s.burst)}
		s.ns[ns] = b
	}
	b.used = now
	return b.lim
}

// pay takes a request's first token for namespace ns, waiting its turn; a
// turn further off than the queue's wait is refused at once, with when it
// would have come. A nil spend (no limit) pays for everything.
func (s *spend) pay(ctx context.Context, ns string) error {
	if s == nil {
		return nil
	}
	r := s.bucket(ns).ReserveN(s.now(), 1)
	delay := r.DelayFrom(s.now())
	if delay == 0 {
		return nil
	}
	if delay > s.wait {
		r.CancelAt(s.now())
		metrics.DataPlaneQueueRefused.WithLabelValues("spent").Inc()
		return &refusal{msg: fmt.Sprintf("namespace %s has spent its requests in this data-plane replica (%g a second, %d at once); its next turn is in %s: try again then",
			ns, float64(s.rate), s.burst, delay.Round(time.Millisecond)), retryAfter: delay}
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		metrics.DataPlaneSpendWait.Observe(delay.Seconds())
		return nil
	case <-ctx.Done():
		r.CancelAt(s.now())
		return ctx.Err()
	}
}

// charge bills namespace ns for the bytes a request moved, past what its
// first token paid for: the namespace's next requests wait it off.
func (s *spend) charge(ns string, bytes int64) {
	if s == nil {
		return
	}
	n := int(bytes / spendBytesPerToken)
	if n <= 0 {
		return
	}
	// A debt larger than the bucket cannot be reserved in one go; a burst's
	// worth already makes the namespace wait a full bucket.
	s.bucket(ns).ReserveN(s.now(), min(n, s.burst))
}
