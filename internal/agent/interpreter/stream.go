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
//
// On stdout it also takes out the run's display frames (frame start, the
// rich result as JSON, \x1e; see replserver.py) and hands each to onDisplay
// where it stood between the output around it.
type stream struct {
	mu      sync.Mutex
	sink    *output.Buffer
	marker  []byte
	pending []byte
	seen    chan struct{}
	// display frames: their start, a frame read so far, the handler.
	frameStart   []byte
	frame        []byte
	inFrame      bool
	frameDropped bool
	frameLimit   int
	onDisplay    func(frame []byte, tooLarge bool)
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
	s.frameStart, s.frame, s.inFrame, s.frameDropped, s.onDisplay = nil, nil, false, false, nil
	s.seen = make(chan struct{})
	s.reads, s.lastRead, s.lastGap = 0, time.Time{}, 0
	return s.seen
}

// frames makes the stream take display frames that begin with start out of
// the output and hand each to onDisplay (tooLarge, with no frame, for one
// longer than limit, which is dropped). Call after attach.
func (s *stream) frames(start []byte, limit int, onDisplay func(frame []byte, tooLarge bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frameStart, s.frameLimit, s.onDisplay = start, limit, onDisplay
}

// detach stops writing to the current buffer, flushing a held-back tail.
func (s *stream) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink != nil && len(s.pending) > 0 {
		_, _ = s.sink.Write(s.pending)
	}
	s.sink, s.marker, s.pending = nil, nil, nil
	s.frameStart, s.frame, s.inFrame, s.frameDropped, s.onDisplay = nil, nil, false, false, nil
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
	for len(data) > 0 {
		if s.inFrame {
			data = s.readFrame(data)
			continue
		}
		end := bytes.Index(data, s.marker)
		start := -1
		if s.frameStart != nil {
			start = bytes.Index(data, s.frameStart)
		}
		switch {
		case start >= 0 && (end < 0 || start < end):
			_, _ = s.sink.Write(data[:start])
			s.inFrame, s.frame, s.frameDropped = true, nil, false
			data = data[start+len(s.frameStart):]
		case end >= 0:
			_, _ = s.sink.Write(data[:end])
			s.marker = nil // anything after the marker belongs to no execution
			close(s.seen)
			return
		default:
			// Hold back a tail that could be the start of the marker or of a frame.
			keep := max(heldBack(data, s.marker), heldBack(data, s.frameStart))
			_, _ = s.sink.Write(data[:len(data)-keep])
			if keep > 0 {
				s.pending = append([]byte(nil), data[len(data)-keep:]...)
			}
			return
		}
	}
}

// readFrame reads a display frame's bytes up to its end (\x1e) and hands
// the frame over; it returns what follows the frame.
func (s *stream) readFrame(data []byte) []byte {
	i := bytes.IndexByte(data, 0x1e)
	body := data
	if i >= 0 {
		body = data[:i]
	}
	if !s.frameDropped {
		if len(s.frame)+len(body) > s.frameLimit {
			s.frame, s.frameDropped = nil, true // too large: read to its end and drop it
		} else {
			s.frame = append(s.frame, body...)
		}
	}
	if i < 0 {
		return nil
	}
	frame, dropped := s.frame, s.frameDropped
	s.inFrame, s.frame, s.frameDropped = false, nil, false
	if s.onDisplay != nil {
		s.onDisplay(frame, dropped)
	}
	return data[i+1:]
}

// heldBack is how many bytes at data's end could be the start of mark.
func heldBack(data, mark []byte) int {
	for k := min(len(mark)-1, len(data)); k > 0; k-- {
		if bytes.HasPrefix(mark, data[len(data)-k:]) {
			return k
		}
	}
	return 0
}
