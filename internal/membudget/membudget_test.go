package membudget

import (
	"bytes"
	"io"
	"testing"
)

func TestANamespaceHoldsItsShareAndTheProcessItsLimit(t *testing.T) {
	b := New(100, 0.5)
	a1, err := b.Acquire("fork", "a", 40)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire("fork", "a", 20); !IsFull(err) || !err.(*Full).Share {
		t.Fatalf("namespace a past its share of 50: got %v", err)
	}
	b1, err := b.Acquire("fork", "b", 50)
	if err != nil {
		t.Fatalf("namespace b within its share: %v", err)
	}
	if _, err := b.Acquire("fork", "c", 20); !IsFull(err) || err.(*Full).Share {
		t.Fatalf("the process past its limit of 100: got %v", err)
	}
	a1.Shrink(10)
	if _, err := b.Acquire("fork", "c", 20); err != nil {
		t.Fatalf("what a shrunk hold gave back is free: %v", err)
	}
	b1.Release()
	b1.Release()
	if b.used != 30 || b.tenants["b"] != 0 {
		t.Fatalf("used %d, b %d after a release (twice): want 30 and 0", b.used, b.tenants["b"])
	}
}

func TestReadAllGrowsByWhatItReadsAndStopsWhenTheBudgetIsFull(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 5*chunk/2)
	b := New(4*chunk, 1)
	h, _ := b.Acquire("fork", "a", 0)
	got, err := h.ReadAll(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(got.Reader())
	if !bytes.Equal(back, data) || got.Len() != int64(len(data)) {
		t.Fatal("the chunks do not read back the bytes")
	}
	if h.Held() != 3*chunk {
		t.Fatalf("held %d for 2.5 chunks read, want 3 chunks", h.Held())
	}
	h2, _ := b.Acquire("fork", "a", 0)
	if _, err := h2.ReadAll(bytes.NewReader(data), int64(len(data))); !IsFull(err) {
		t.Fatalf("a second read past the budget: got %v", err)
	}
	h2.Release()
	h.Release()
	if b.used != 0 {
		t.Fatalf("used %d after every hold was released", b.used)
	}
	h3, _ := b.Acquire("fork", "a", 0)
	if _, err := h3.ReadAll(bytes.NewReader(data), chunk); err == nil || IsFull(err) {
		t.Fatalf("more than the limit must be an error of its own, got %v", err)
	}
}

func TestNoBudgetRefusesNothing(t *testing.T) {
	var nilBudget *Budget
	h, err := nilBudget.Acquire("fork", "a", 1<<40)
	if err != nil || h.Grow(1<<40) != nil {
		t.Fatal("a nil budget refused")
	}
	h.Release()
}

// Three reads of 52 MiB growing at once in a namespace whose share is 80
// MiB: the oldest always goes on; the others are refused.
func TestOfWorkGrowingAtOnceTheOldestGoesOn(t *testing.T) {
	b := New(160, 0.5)
	var hs []*Hold
	for range 3 {
		h, err := b.Acquire("fork", "a", 0)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	alive := []bool{true, true, true}
	for range 52 {
		for i, h := range hs {
			if alive[i] && h.Grow(1) != nil {
				alive[i] = false
				h.Release()
			}
		}
	}
	if !alive[0] || alive[1] && alive[2] {
		t.Fatalf("alive %v: want the first, and not all", alive)
	}
}

// The largest snapshot may need more than a namespace's share, or than the
// whole budget: it runs alone, and blocks others while it does, rather than
// never running.
func TestWorkLargerThanTheBudgetRunsAlone(t *testing.T) {
	b := New(100, 0.5)
	big, err := b.Acquire("suspend", "a", 150)
	if err != nil {
		t.Fatalf("work alone in the process, larger than the budget: %v", err)
	}
	if err := big.Grow(10); err != nil {
		t.Fatalf("and it grows while alone: %v", err)
	}
	if _, err := b.Acquire("suspend", "b", 1); !IsFull(err) {
		t.Fatalf("other work while it runs: got %v, want refused", err)
	}
	big.Release()
	a1, _ := b.Acquire("fork", "a", 40)
	if err := a1.Grow(30); err != nil {
		t.Fatalf("the process's oldest hold may grow past its namespace's share: %v", err)
	}
	b1, err := b.Acquire("fork", "b", 20)
	if err != nil {
		t.Fatalf("another namespace within its share and the limit: %v", err)
	}
	if err := b1.Grow(20); !IsFull(err) {
		t.Fatalf("a younger hold past the limit: got %v", err)
	}
	a1.Release()
	b1.Release()
	if len(b.holds) != 0 || b.used != 0 {
		t.Fatalf("holds %d, used %d after every release", len(b.holds), b.used)
	}
}
