package interpreter

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// The channel from the interpreter (its fd 4, the agent's reply pipe).
//
// Nothing on it is trusted: the code runs in the REPL server's process and can
// write to the pipe, close it or stop answering. So the agent holds every
// message to one rule: it belongs to the request in flight, by that request's
// id and its per-run secret (a second random value made for this request
// alone), and it is a reply or one of the bridge calls a run may make. A
// message that breaks the rule, bytes that are not a message, a line longer
// than the limit, a message while no request is in flight, or EOF while the
// process lives, is a protocol violation: the agent kills the interpreter with
// its whole process tree and reports the state lost, with the reason. Nothing
// the code writes is dropped and read past, so nothing it writes can become
// another run's result.

// runKey identifies a request in flight: its id and its per-run secret.
type runKey struct{ id, secret string }

func newRunKey() *runKey { return &runKey{id: newID(), secret: newID()} }

// newID is a random value the code cannot guess.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// rpcMessage is one message of the REPL server's.
type rpcMessage struct {
	ID json.RawMessage `json:"id,omitempty"`
	// Run is the id of the request a bridge call belongs to.
	Run string `json:"run,omitempty"`
	// Secret is the per-run secret of the request the message belongs to.
	Secret string          `json:"secret,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// bridgeMethods are the calls a run's code may make to the caller.
var bridgeMethods = map[string]bool{
	"llm_query": true, "rlm_query": true, "llm_query_batched": true, "rlm_query_batched": true,
	"read_chunk": true, "search_chunks": true, "list_chunks_by_tag": true, "get_linked_chunks": true,
}

// ErrorProtocolViolation is the error type of a run that the agent ended
// because the interpreter broke the channel's rules.
const ErrorProtocolViolation = "ProtocolViolation"

// check says why m does not belong to the request in flight (key; nil when
// none), "" when it does. ready says whether the start-up message came.
func check(m *rpcMessage, key *runKey, ready bool) string {
	switch {
	case !ready:
		if m.Method != "ready" {
			return "its first message was not the start-up message"
		}
		return ""
	case key == nil:
		return "it sent a message while no request was in flight"
	case m.Secret != key.secret:
		return "a message without the secret of the request in flight"
	case m.Method != "":
		if !bridgeMethods[m.Method] {
			return fmt.Sprintf("a call of an unknown method %.40q", m.Method)
		}
		if m.Run != key.id {
			return "a bridge call for another request"
		}
		return ""
	case string(m.ID) != `"`+key.id+`"`:
		return "a reply for another request"
	case m.Error == nil && len(m.Result) == 0:
		return "a reply with neither result nor error"
	}
	return ""
}

// readMessages reads the interpreter's messages until EOF: those of the
// request in flight go to p.msgs, anything else ends the process.
func (it *Interpreter) readMessages(p *process, r io.Reader) {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, size, err := readLine(br, it.cfg.MaxMessageBytes)
		var bad string
		switch {
		case size > it.cfg.MaxMessageBytes:
			bad = fmt.Sprintf("a message longer than the limit of %d bytes", it.cfg.MaxMessageBytes)
		case len(bytes.TrimSpace(line)) == 0:
		case err != nil:
			// Judged with the closed channel: a process that died writing is
			// reported by how it died.
			it.channelClosed(p, "it closed its channel to the agent in the middle of a message")
			return
		default:
			var m rpcMessage
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				bad = "bytes that are not a JSON-RPC message"
			} else {
				bad = p.accept(&m)
			}
		}
		if bad != "" {
			it.violation(p, bad, line)
		}
		if err != nil {
			it.channelClosed(p, "it closed its channel to the agent")
			return
		}
	}
}

// accept passes m on to the request in flight, or says why it cannot.
func (p *process) accept(m *rpcMessage) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != "" {
		return "" // being ended: nothing more it says counts
	}
	if reason := check(m, p.key, p.ready); reason != "" {
		return reason
	}
	if !p.ready {
		p.ready = true
	} else if m.Method != "" {
		// One unanswered call at a time (the REPL server makes them one by
		// one), and no more than the run may make: a flood of them is a
		// forgery, and each would hold the agent's memory until answered.
		if p.bridgePending >= 1 {
			return "a bridge call while another was unanswered"
		}
		if p.bridgeCalls >= p.maxBridge {
			return fmt.Sprintf("more bridge calls than the run's limit of %d", p.maxBridge)
		}
		p.bridgePending++
		p.bridgeCalls++
	}
	// Only violations are left unread: the run loop (or start-up) reads every
	// message of the request in flight, and a genuine server sends at most a
	// reply and one call at a time, far below the buffer.
	select {
	case p.msgs <- *m:
		return ""
	default:
		return "more messages than a request can have"
	}
}

// closeRequest ends the request in flight: from now on any message is a
// violation, and one the reader already passed on is one too many.
func (p *process) closeRequest(it *Interpreter) {
	p.expect(nil, 0)
	select {
	case <-p.msgs:
		it.violation(p, "a second message for a request that had its reply", nil)
	default:
	}
}

// answered says the unanswered bridge call was answered.
func (p *process) answered() {
	p.mu.Lock()
	if p.bridgePending > 0 {
		p.bridgePending--
	}
	p.mu.Unlock()
}

// logSample is how much of an offending message the log shows.
const logSample = 120

// violation ends the interpreter for breaking the channel's rules. The first
// reason is the one reported.
func (it *Interpreter) violation(p *process, reason string, sample []byte) {
	if p.dead() {
		// It died (killed from outside, at its memory limit): its pipes
		// closed a moment before the agent reaped it. How it died is the
		// reason, not what its closed pipes looked like.
		return
	}
	if !p.setEnd(ErrorProtocolViolation, "the interpreter broke the agent's protocol: "+reason) {
		// Ended already, for this or another reason.
		return
	}
	it.cfg.Log.Info("protocol violation: killing the interpreter", "reason", reason, "pid", p.pid(),
		"start", string(sample[:min(len(sample), logSample)]))
	go p.kill()
}

// channelGrace is how long an interpreter whose channel closed has to exit
// before the closed channel counts as a violation: its process ending closes
// the channel before the agent learns that it ended, and on a busy machine
// (or an init of a PID namespace that waits for the rest of it) that takes a
// while.
const channelGrace = time.Second

// channelClosed judges a closed channel (EOF, a request it did not take)
// once the process had channelGrace to end.
func (it *Interpreter) channelClosed(p *process, reason string) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	grace := time.After(it.channelGrace)
	for !p.dead() {
		select {
		case <-p.exited:
			return
		case <-t.C:
		case <-grace:
			it.violation(p, reason, nil)
			return
		}
	}
}

// dead reports whether the process has exited, reaped or not: a zombie
// (exited, its Wait not returned yet) is dead.
func (p *process) dead() bool {
	if !p.alive() {
		return true
	}
	pid := p.pid()
	if pid == 0 {
		return false
	}
	st, ok := readStat(pid)
	return !ok || st.state == 'Z' || st.state == 'X'
}

// readLine reads one line of at most max bytes. For a longer line it returns
// the line's length and only its start, having read and dropped the rest; it
// never holds more than max bytes of it.
func readLine(r *bufio.Reader, max int) (line []byte, size int, err error) {
	var chunks [][]byte // copies of the buffer's fragments, joined once at the end
	for {
		frag, err := r.ReadSlice('\n')
		switch {
		case size+len(frag) <= max+1: // +1: the newline
			chunks = append(chunks, append([]byte(nil), frag...))
		case size <= max: // the line just became too long: keep a sample of its start
			var sample []byte
			for _, c := range append(chunks, frag) {
				sample = append(sample, c[:min(len(c), logSample-len(sample))]...)
			}
			chunks = [][]byte{sample}
		}
		size += len(frag)
		if !errors.Is(err, bufio.ErrBufferFull) {
			if size > 0 && err == nil {
				size-- // the newline
			}
			if len(chunks) == 1 {
				return chunks[0], size, err
			}
			return bytes.Join(chunks, nil), size, err
		}
	}
}
