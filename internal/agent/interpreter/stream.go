package interpreter

import (
	"bytes"
	"io"
	"sync"
	"time"

	"github.com/warmpool/warmpool/internal/agent/output"
)

// stream reads one of the interpreter's output fds for as long as the process
// lives and hands what it reads to the current execution's buffer. Output
// written while no execution runs (a leftover background subprocess) is dropped.
type stream struct {
	mu      sync.Mutex
	sink    *output.Buffer
	marker  []byte
	pending []byte
	seen    chan struct{}
	// reads since attach, when the last was, and the gap before it.
	reads    int
	lastRead time.Time
	lastGap  time.Duration
}

// attach directs the stream to buf until marker is read.
func (s *stream) attach(buf *output.Buffer, marker []byte) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sink, s.marker, s.pending = buf, marker, nil
	s.seen = make(chan struct{})
	s.reads, s.lastRead, s.lastGap = 0, time.Time{}, 0
	return s.seen
}

// detach stops writing to the current buffer, flushing a held-back tail.
func (s *stream) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink != nil && len(s.pending) > 0 {
		_, _ = s.sink.Write(s.pending)
	}
	s.sink, s.marker, s.pending = nil, nil, nil
}

func (s *stream) run(r io.Reader) {
	buf := make([]byte, 64*1024)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			s.feed(buf[:n])
		}
		if err != nil {
			return
		}
		if n < len(buf)/2 && s.flooded() {
			time.Sleep(readGather)
		}
	}
}

// Code that prints in a loop writes a line at a time, and a reader that wakes
// for each write costs more than the write: under gVisor a print to a pipe
// nobody reads took 13 µs, to the agent's stdout pipe 70-500 µs. Once a run has
// written often enough to be a flood, the reader lets the pipe gather output
// between reads; the first few reads of a run (its prints, the marker that
// ends it) are taken at once, so short runs lose no time.
const (
	readGather    = time.Millisecond
	floodReads    = 8
	floodInterval = 5 * time.Millisecond
)

// flooded reports whether the current run's output comes in a flood: more
// than floodReads reads so far, the last two less than floodInterval apart.
func (s *stream) flooded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads > floodReads && s.lastGap < floodInterval
}

func (s *stream) feed(chunk []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.reads > 0 {
		s.lastGap = now.Sub(s.lastRead)
	}
	s.reads++
	s.lastRead = now
	if s.sink == nil || s.marker == nil {
		return
	}
	data := chunk
	if len(s.pending) > 0 {
		data = append(s.pending, chunk...)
		s.pending = nil
	}
	if i := bytes.Index(data, s.marker); i >= 0 {
		_, _ = s.sink.Write(data[:i])
		s.marker = nil // anything after the marker belongs to no execution
		close(s.seen)
		return
	}
	// Hold back a tail that could be the start of the marker.
	keep := 0
	for k := min(len(s.marker)-1, len(data)); k > 0; k-- {
		if bytes.HasPrefix(s.marker, data[len(data)-k:]) {
			keep = k
			break
		}
	}
	_, _ = s.sink.Write(data[:len(data)-keep])
	if keep > 0 {
		s.pending = append([]byte(nil), data[len(data)-keep:]...)
	}
}
