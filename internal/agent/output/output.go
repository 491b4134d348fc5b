// Package output captures a stream of user output with a byte limit, so that
// the agent's memory stays bounded whatever the code prints.
package output

import (
	"fmt"
	"unicode/utf8"
)

// Buffer keeps the first Limit bytes written to it and counts the rest.
type Buffer struct {
	limit   int
	data    []byte
	dropped int64
	// OnWrite, when set, sees every kept chunk as it arrives (for streaming).
	OnWrite func([]byte)
}

// NewBuffer returns a Buffer that keeps up to limit bytes.
func NewBuffer(limit int) *Buffer { return &Buffer{limit: limit} }

// Write keeps what fits and drops the rest; it never fails, so the producer
// (the user's code) is never blocked or broken by a full buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	room := b.limit - len(b.data)
	kept := p
	if len(kept) > room {
		if room < 0 {
			room = 0
		}
		kept = kept[:room]
	}
	b.dropped += int64(len(p) - len(kept))
	if len(kept) > 0 {
		b.data = append(b.data, kept...)
		if b.OnWrite != nil {
			b.OnWrite(kept)
		}
	}
	return len(p), nil
}

// Truncated reports whether bytes were left out.
func (b *Buffer) Truncated() bool { return b.dropped > 0 }

// String returns the kept output as valid UTF-8, followed, when bytes were
// left out, by a notice that says how many.
func (b *Buffer) String(stream string) string {
	data := b.data
	dropped := b.dropped
	// A cut can split a multi-byte character: move the partial one to the omitted count.
	if dropped > 0 {
		for i := 0; i < utf8.UTFMax && len(data) > 0 && !utf8.Valid(data); i++ {
			data = data[:len(data)-1]
			dropped++
		}
	}
	s := string(data)
	if dropped > 0 {
		s += fmt.Sprintf("\n[warmpool: %d more bytes of %s omitted]\n", dropped, stream)
	}
	return s
}
