// Package membudget admits the work that holds a Session's state in this
// process's memory (forks, suspends, resumes: up to a snapshot's limit each)
// against one budget in bytes, derived from the container's memory limit,
// of which one namespace may hold only a share. Work the budget cannot take
// is refused at once (the data plane answers 429 with Retry-After, a
// reconcile looks again later) instead of getting the process OOM-killed
// with every other caller's requests in it.
package membudget

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmpool/warmpool/internal/metrics"
)

// RetryAfter is when refused work may try again: the holds it waited for
// are snapshots being read or restored, which take seconds at most.
const RetryAfter = 2 * time.Second

// chunk is the unit a hold grows by while it reads.
const chunk = 1 << 20

// Budget is a process-wide budget in bytes. The zero Budget and a nil one
// refuse nothing.
type Budget struct {
	mu      sync.Mutex
	limit   int64 // 0: no limit
	share   int64 // what one namespace may hold
	used    int64
	tenants map[string]int64
	// holds are the holds not released, by the order they were taken in.
	holds map[*Hold]uint64
	seq   uint64
}

// New returns a budget of limit bytes, of which one namespace may hold
// tenantShare (0 < tenantShare <= 1).
func New(limit int64, tenantShare float64) *Budget {
	if tenantShare <= 0 || tenantShare > 1 {
		tenantShare = 1
	}
	metrics.MemoryBudget.Set(float64(limit))
	return &Budget{limit: limit, share: int64(float64(limit) * tenantShare), tenants: map[string]int64{}, holds: map[*Hold]uint64{}}
}

// Limit is the budget in bytes (0: none).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// Full is the refusal of work the budget cannot take now.
type Full struct {
	Namespace string
	Want      int64
	// Share: the namespace holds its share; else the process is at its limit.
	Share bool
	Limit int64
}

func (e *Full) Error() string {
	if e.Share {
		return fmt.Sprintf("namespace %s holds its share (%d MiB) of this replica's memory for snapshots, forks and resumes: try again in %s",
			e.Namespace, e.Limit>>20, RetryAfter)
	}
	return fmt.Sprintf("this replica's memory for snapshots, forks and resumes (%d MiB) is taken: try again in %s", e.Limit>>20, RetryAfter)
}

// IsFull reports whether err is (or wraps) a refusal of the budget.
func IsFull(err error) bool {
	var f *Full
	return errors.As(err, &f)
}

// Acquire takes n bytes for namespace ns, or refuses with *Full. op names
// the work for the refusal metric (a bounded set: fork, suspend, resume).
func (b *Budget) Acquire(op, ns string, n int64) (*Hold, error) {
	h := &Hold{b: b, op: op, ns: ns}
	if b != nil && b.limit > 0 {
		b.mu.Lock()
		b.seq++
		b.holds[h] = b.seq
		b.mu.Unlock()
	}
	if err := h.Grow(n); err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

// oldestLocked reports whether h is the oldest hold not released.
func (b *Budget) oldestLocked(h *Hold) bool {
	mine, ok := b.holds[h]
	if !ok {
		return false
	}
	for _, seq := range b.holds {
		if seq < mine {
			return false
		}
	}
	return true
}

// Hold is bytes taken from a budget, until Release.
type Hold struct {
	b    *Budget
	op   string
	ns   string
	held int64
}

// Grow takes n more bytes, or refuses with *Full (and takes nothing). The
// oldest hold of the process may grow past its namespace's share and past
// the limit: work that reads as it goes always has one piece that goes on
// (several growing at once would otherwise all be refused), and the largest
// snapshot runs before others rather than never.
func (h *Hold) Grow(n int64) error {
	b := h.b
	if b == nil || b.limit <= 0 || n <= 0 {
		h.held += max(n, 0)
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	first := b.oldestLocked(h)
	switch {
	case b.tenants[h.ns]+n > b.share && !first:
		metrics.MemoryBudgetRefused.WithLabelValues(h.op, "namespace").Inc()
		return &Full{Namespace: h.ns, Want: n, Share: true, Limit: b.share}
	case b.used+n > b.limit && !first:
		metrics.MemoryBudgetRefused.WithLabelValues(h.op, "process").Inc()
		return &Full{Namespace: h.ns, Want: n, Limit: b.limit}
	}
	b.used += n
	b.tenants[h.ns] += n
	h.held += n
	metrics.MemoryBudgetInUse.Set(float64(b.used))
	return nil
}

// Shrink gives back what the hold has above n bytes.
func (h *Hold) Shrink(n int64) {
	if h == nil || n >= h.held {
		return
	}
	h.give(h.held - max(n, 0))
}

// Release gives back everything the hold has. Safe to call twice.
func (h *Hold) Release() {
	if h == nil {
		return
	}
	h.give(h.held)
	if b := h.b; b != nil && b.limit > 0 {
		b.mu.Lock()
		delete(b.holds, h)
		b.mu.Unlock()
	}
}

func (h *Hold) give(n int64) {
	h.held -= n
	b := h.b
	if b == nil || b.limit <= 0 || n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.tenants[h.ns] -= n; b.tenants[h.ns] <= 0 {
		delete(b.tenants, h.ns)
	}
	metrics.MemoryBudgetInUse.Set(float64(b.used))
}

// Held is what the hold has.
func (h *Hold) Held() int64 { return h.held }

// ReadAll reads r, at most limit bytes (more is an error), growing the hold
// by each megabyte before it is allocated: a read the budget cannot take
// stops with *Full. The bytes come back in chunks, never copied into one
// array (a reader over them is Chunks.Reader).
func (h *Hold) ReadAll(r io.Reader, limit int64) (Chunks, error) {
	var out Chunks
	var total int64
	for {
		if err := h.Grow(chunk); err != nil {
			return nil, err
		}
		buf := make([]byte, chunk)
		n, err := io.ReadFull(r, buf)
		out = append(out, buf[:n])
		total += int64(n)
		switch {
		case total > limit:
			return nil, fmt.Errorf("more than the limit of %d bytes", limit)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return out, nil
		case err != nil:
			return nil, err
		}
	}
}

// Chunks are bytes read in pieces.
type Chunks [][]byte

// Len is how many bytes the chunks hold.
func (c Chunks) Len() int64 {
	var n int64
	for _, b := range c {
		n += int64(len(b))
	}
	return n
}

// Reader reads the chunks in order, without copying them.
func (c Chunks) Reader() io.Reader {
	rs := make([]io.Reader, len(c))
	for i, b := range c {
		rs[i] = bytes.NewReader(b)
	}
	return io.MultiReader(rs...)
}

// FromContainer returns fraction of the memory limit of this process's
// container (cgroup v2, else v1), or fallback when it has none.
func FromContainer(fraction float64, fallback int64) int64 {
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		// cgroup v1 says "no limit" with a number near the largest int64.
		if err != nil || v <= 0 || v >= 1<<60 {
			return fallback
		}
		return int64(float64(v) * fraction)
	}
	return fallback
}
