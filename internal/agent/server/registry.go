package server

import (
	"sync"
	"sync/atomic"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// execution is one run, remembered by its ID so that a caller that comes back
// (a manager restarted mid-run) attaches to it instead of running it twice.
type execution struct {
	id        string
	done      chan struct{}
	result    *protocol.Result
	interrupt func() bool
	// interruptAsked is set by the first interrupt, for a run that had not
	// begun when it came.
	interruptAsked atomic.Bool

	mu      sync.Mutex
	events  []protocol.Event // for the one streaming caller; bounded by the output limits
	notify  chan struct{}
	bridges map[string]chan protocol.BridgeAnswer
}

func (e *execution) setInterrupt(f func() bool) {
	e.mu.Lock()
	e.interrupt = f
	e.mu.Unlock()
}

func (e *execution) doInterrupt() {
	e.interruptAsked.Store(true) // before f: a run not started yet finds it (Hooks.Interrupted)
	e.mu.Lock()
	f := e.interrupt
	e.mu.Unlock()
	if f != nil {
		f()
	}
}

func (e *execution) emit(ev protocol.Event) {
	e.mu.Lock()
	// Output arrives one write at a time (a print is one or two): consecutive
	// pieces of one stream go out as one event.
	if n := len(e.events); n > 0 && isOutput(ev.Type) && e.events[n-1].Type == ev.Type {
		e.events[n-1].Data += ev.Data
	} else {
		e.events = append(e.events, ev)
	}
	e.mu.Unlock()
	select {
	case e.notify <- struct{}{}:
	default:
	}
}

func isOutput(t string) bool { return t == protocol.EventStdout || t == protocol.EventStderr }

// take returns the events not yet taken.
func (e *execution) take() []protocol.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := e.events
	e.events = nil
	return ev
}

// registry keeps running executions and the results of the last `keep` finished ones.
type registry struct {
	mu       sync.Mutex
	byID     map[string]*execution
	finished []string // FIFO of finished IDs, for eviction
	keep     int
}

func newRegistry(keep int) *registry {
	return &registry{byID: map[string]*execution{}, keep: keep}
}

// getOrCreate returns the execution with this ID and false, or a new one and true.
func (r *registry) getOrCreate(id string) (*execution, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byID[id]; ok {
		return e, false
	}
	e := &execution{id: id, done: make(chan struct{}), notify: make(chan struct{}, 1), bridges: map[string]chan protocol.BridgeAnswer{}}
	r.byID[id] = e
	return e, true
}

func (r *registry) get(id string) *execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// forget drops an execution that never started (no worker was free).
func (r *registry) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byID, id)
}

func (r *registry) finish(e *execution, res *protocol.Result) {
	// A bridge call still unanswered when the run ended (its timeout, an
	// interrupt) has nobody waiting: its late answer is refused (404), not
	// taken into a buffer no one reads.
	e.mu.Lock()
	clear(e.bridges)
	e.mu.Unlock()
	r.mu.Lock()
	e.result = res
	r.finished = append(r.finished, e.id)
	for len(r.finished) > r.keep {
		delete(r.byID, r.finished[0])
		r.finished = r.finished[1:]
	}
	r.mu.Unlock()
	close(e.done)
}
