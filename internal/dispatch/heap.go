package dispatch

import "time"

// queued is an entry in one heap; idx points at the entry's index field for
// that heap, so an entry can sit in its session's queue and its pool's queue
// at once and be removed from either in O(log n).
type queued struct {
	e   *entry
	idx *int
}

// entryHeap orders entries first come, first served: creation time, then name.
type entryHeap []queued

func (h entryHeap) Len() int { return len(h) }

func (h entryHeap) Less(i, j int) bool {
	a, b := h[i].e, h[j].e
	return before(a.created, a.name.Name, b.created, b.name.Name)
}

func before(aCreated time.Time, aName string, bCreated time.Time, bName string) bool {
	if !aCreated.Equal(bCreated) {
		return aCreated.Before(bCreated)
	}
	return aName < bName
}

func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	*h[i].idx = i
	*h[j].idx = j
}

func (h *entryHeap) Push(x any) {
	q := x.(queued)
	*q.idx = len(*h)
	*h = append(*h, q)
}

func (h *entryHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	*q.idx = -1
	*h = old[:len(old)-1]
	return q.e
}

func (h entryHeap) peek() *entry {
	if len(h) == 0 {
		return nil
	}
	return h[0].e
}
