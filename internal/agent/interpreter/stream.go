package interpreter

import (
	"bytes"
	"io"
	"sync"

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
}

// attach directs the stream to buf until marker is read.
func (s *stream) attach(buf *output.Buffer, marker []byte) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sink, s.marker, s.pending = buf, marker, nil
	s.seen = make(chan struct{})
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
	}
}

func (s *stream) feed(chunk []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
