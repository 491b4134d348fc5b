package interpreter

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/warmpool/warmpool/internal/agent/output"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// markerWait bounds how long the agent waits, after the reply, for the end
// marker on fd 1 and 2 (it never arrives when the code closed them).
const markerWait = 2 * time.Second

// Execute runs Python code and returns its result. It returns ErrBusy when
// another execution runs. Timeouts, interrupts, deaths and protocol
// violations of the interpreter are results, not errors.
func (it *Interpreter) Execute(req protocol.ExecuteRequest, hooks Hooks) (*protocol.Result, error) {
	if !it.busy.TryLock() {
		return nil, ErrBusy
	}
	defer it.busy.Unlock()

	res := &protocol.Result{ID: req.ID, StartedAt: time.Now()}
	finish := func() *protocol.Result { return res.Finish(time.Now()) }
	p, lost, err := it.prepare()
	if err != nil {
		res.Status = protocol.StatusFailed
		res.StateLost = true
		res.StateLostReason = "the interpreter could not start: " + err.Error()
		res.Error = &protocol.Error{Type: protocol.ErrorInterpreterDied, Message: res.StateLostReason}
		return finish(), nil
	}
	res.Interpreter = p.tag
	if req.Interpreter != "" && req.Interpreter != p.tag {
		// The caller's state lived in an interpreter that died or was replaced:
		// running on this one would silently start from nothing.
		it.servedBy(0) // said now
		res.Status = protocol.StatusFailed
		res.StateLost = true
		res.StateLostReason = lost
		msg := "the interpreter that held this session's state died or was replaced since its last run; the code did not run"
		if lost == "" {
			res.StateLostReason = "the interpreter named is not the one running"
		} else {
			msg += " (" + lost + ")"
		}
		res.Error = &protocol.Error{Type: protocol.ErrorInterpreterRestarted, Message: msg}
		return finish(), nil
	}
	if lost != "" {
		res.StateLost, res.StateLostReason = true, lost
	}

	timeout := protocol.Millis(req.TimeoutMillis, it.cfg.DefaultTimeout)
	grace := protocol.Millis(req.GraceMillis, it.cfg.DefaultGrace)
	limit := req.MaxOutputBytes
	if limit <= 0 {
		limit = it.cfg.DefaultMaxOutputBytes
	}
	maxBridge := req.MaxBridgeCalls
	if maxBridge <= 0 {
		maxBridge = it.cfg.DefaultMaxBridgeCalls
	}
	if !req.Bridge || hooks.OnBridge == nil {
		maxBridge = 0
	}

	stdout, stderr := output.NewBuffer(limit), output.NewBuffer(limit)
	stdout.OnWrite, stderr.OnWrite = hooks.OnStdout, hooks.OnStderr
	marker, displayStart := newMarkers()
	outSeen := p.stdout.attach(stdout, marker)
	errSeen := p.stderr.attach(stderr, marker)
	var displays displayCollector
	p.stdout.frames(displayStart, protocol.DefaultMaxDisplayBytes*2, func(frame []byte, tooLarge bool) {
		if d, ok := displays.add(frame, tooLarge); ok && hooks.OnDisplay != nil {
			hooks.OnDisplay(d)
		}
	})
	defer p.stdout.detach()
	defer p.stderr.detach()

	interrupt := make(chan struct{}, 1)
	done := make(chan struct{})
	defer close(done)
	key := newRunKey() // see channel.go: the code cannot know it in advance
	p.expect(key, maxBridge)
	defer p.expect(nil, 0)
	it.mu.Lock()
	it.interrupt = interrupt
	it.mu.Unlock()
	if hooks.Interrupted != nil && hooks.Interrupted() {
		// Asked before this run could take it (Interrupt found no run).
		interrupt <- struct{}{}
	}
	defer func() {
		it.mu.Lock()
		it.interrupt = nil
		it.mu.Unlock()
	}()

	params := map[string]any{
		"code": req.Code, "env": req.Env, "marker": string(marker), "bridge": maxBridge > 0,
		"max_bridge_calls": maxBridge, "max_result_chars": it.cfg.MaxResultChars,
		"clear_interrupt": p.strayInterrupt, "display": string(displayStart),
		"max_display_bytes": protocol.DefaultMaxDisplayBytes, "max_run_display_bytes": protocol.DefaultMaxRunDisplayBytes,
	}
	p.strayInterrupt = false
	if len(req.Context) > 0 {
		params["context"] = req.Context
	}
	if maxBridge > 0 && len(req.BridgeMethods) > 0 {
		params["bridge_methods"] = req.BridgeMethods
	}
	res.StartedAt = time.Now()
	// The deadline runs from here, whatever the send does.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	if err := p.send(map[string]any{"jsonrpc": "2.0", "id": key.id, "secret": key.secret, "method": "execute", "params": params}); err != nil {
		// A process that just died (its pipe closed first) is reported by how it died.
		go it.channelClosed(p, "it did not take the agent's request ("+err.Error()+")")
	}

	var memory *memoryWatch
	if it.cfg.Limits.MemoryBytes > 0 {
		memory = &memoryWatch{budget: it.cfg.Limits.MemoryBytes}
		stopWatch := make(chan struct{})
		defer close(stopWatch)
		go memory.watch(p, stopWatch)
	}

	var graceC, killC <-chan time.Time
	var stopReason protocol.Status // set once SIGINT was sent by us
	sigint := func(reason protocol.Status) {
		if stopReason != "" {
			return
		}
		stopReason = reason
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		graceC = time.After(grace)
	}
	var reply *rpcMessage
loop:
	for {
		select {
		case m := <-p.msgs:
			if why := check(&m, key, true); why != "" {
				// Accepted for an earlier request a moment before it ended.
				it.violation(p, why, nil)
				continue
			}
			if m.Method != "" {
				it.bridge(p, m, hooks, done)
				continue
			}
			reply = &m
			break loop
		case <-p.exited:
			break loop
		case <-deadline.C:
			sigint(protocol.StatusTimedOut)
		case <-interrupt:
			sigint(protocol.StatusInterrupted)
		case <-graceC:
			graceC = nil
			p.setEnd(protocol.ErrorInterpreterKilled, fmt.Sprintf(
				"the code did not stop within %s after SIGINT, so the agent killed the interpreter and its processes", grace))
			go p.kill()
			killC = time.After(killWait)
		case <-killC:
			break loop // not gone after SIGKILL: abandoned (kill), and the run ends all the same
		}
	}

	// The request is over: whatever comes for it from now on (a second reply,
	// the real one after a forgery) is a violation, not the next run's.
	p.closeRequest(it)
	if reply != nil {
		waitMarkers(outSeen, errSeen)
	} else {
		// Ended (or being killed): read what it wrote before it ended, within a bound.
		select {
		case <-p.exited:
		case <-time.After(killWait):
		}
		drainWait(p)
	}
	p.stdout.detach()
	p.stderr.detach()
	res.Displays = displays.list
	res.Stdout, res.StdoutTruncated = stdout.String("stdout"), stdout.Truncated()
	res.Stderr, res.StderrTruncated = stderr.String("stderr"), stderr.Truncated()

	if reply == nil || !p.alive() {
		// The process ended: the run says so, and the next one starts fresh.
		it.servedBy(0)
		it.restartAsync()
		kind, why := p.ending()
		res.StateLost = true
		res.StateLostReason = why
		res.Result = nil
		switch {
		case memory != nil && memory.overError() != "":
			res.Status = protocol.StatusFailed
			res.Error = &protocol.Error{Type: ErrorMemoryLimitExceeded, Message: memory.overError()}
			res.StateLostReason = memory.overError()
		case stopReason != "":
			// The deadline (or an interrupt) fired: that is how the run ended,
			// whatever the code did after it.
			res.Status = stopReason
			res.Error = &protocol.Error{Type: kind, Message: why + ": variables and imports of earlier executions are lost"}
		default:
			res.Status = protocol.StatusFailed
			res.Error = &protocol.Error{Type: kind, Message: why + ", so a fresh one was started: variables and imports of " +
				"earlier executions are lost"}
		}
		return finish(), nil
	}
	it.servedBy(p.gen)
	if reply.Error != nil { // the REPL server refused the request
		res.Status = protocol.StatusFailed
		if stopReason != "" {
			res.Status = stopReason
		}
		res.Error = &protocol.Error{Type: "AgentError", Message: reply.Error.Message}
		return finish(), nil
	}
	var r struct {
		Status string          `json:"status"`
		Result *string         `json:"result"`
		Error  *protocol.Error `json:"error"`
	}
	if err := json.Unmarshal(reply.Result, &r); err != nil {
		it.violation(p, "a reply that is not a result", nil)
		res.Status, res.StateLost, res.StateLostReason = protocol.StatusFailed, true, "the interpreter broke the agent's protocol"
		res.Error = &protocol.Error{Type: ErrorProtocolViolation, Message: "the interpreter's reply is not a result: " + err.Error()}
		it.servedBy(0)
		return finish(), nil
	}
	res.Result, res.Error = r.Result, r.Error
	p.strayInterrupt = stopReason != "" && r.Status != "interrupted"
	switch {
	case stopReason != "":
		// Whatever the code did once it was stopped (caught the
		// KeyboardInterrupt, was in a slow __repr__ when it came), the run
		// ended at its deadline or at the interrupt.
		res.Status = stopReason
		if res.Error == nil || r.Status == "ok" || r.Status == "final" {
			res.Error = stoppedError(stopReason, timeout)
		}
		res.Final = false
	case r.Status == "ok":
		res.Status = protocol.StatusSucceeded
	case r.Status == "final":
		res.Status, res.Final = protocol.StatusSucceeded, true
	default: // "error", and a KeyboardInterrupt the code raised itself
		res.Status = protocol.StatusFailed
	}
	return finish(), nil
}

// stoppedError says why a run that the agent stopped, and that went on to
// end by itself, is reported stopped.
func stoppedError(status protocol.Status, timeout time.Duration) *protocol.Error {
	if status == protocol.StatusTimedOut {
		return &protocol.Error{Type: "TimeoutError", Message: fmt.Sprintf(
			"the run passed its timeout of %s: it was interrupted then (SIGINT), and what it did after that does not count", timeout)}
	}
	return &protocol.Error{Type: "KeyboardInterrupt", Message: "the run was interrupted (SIGINT) at the caller's request"}
}

// bridge hands a call from the code to the caller and sends back the answer.
func (it *Interpreter) bridge(p *process, m rpcMessage, hooks Hooks, done <-chan struct{}) {
	call := protocol.BridgeCall{ID: strings.Trim(string(m.ID), `"`), Method: m.Method, Params: m.Params}
	go func() {
		var answer map[string]any
		if hooks.OnBridge == nil {
			answer = map[string]any{"jsonrpc": "2.0", "id": call.ID, "error": map[string]any{"code": -32601, "message": "no bridge handler"}}
		} else if result, err := hooks.OnBridge(call, done); err != nil {
			answer = map[string]any{"jsonrpc": "2.0", "id": call.ID, "error": map[string]any{"code": -32000, "message": err.Error()}}
		} else {
			if len(result) == 0 {
				result = json.RawMessage("null")
			}
			answer = map[string]any{"jsonrpc": "2.0", "id": call.ID, "result": result}
		}
		// Answered before it is sent: the code's next call may follow at once.
		p.answered()
		if err := p.send(answer); err != nil {
			it.cfg.Log.V(1).Info("bridge answer not delivered", "call", call.ID, "err", err.Error())
		}
	}()
}

func waitMarkers(chans ...<-chan struct{}) {
	timer := time.NewTimer(markerWait)
	defer timer.Stop()
	for _, c := range chans {
		select {
		case <-c:
		case <-timer.C:
			return
		}
	}
}

// drainWait waits for the output readers to reach EOF; a subprocess of the code
// that still holds the pipes open must not hold up the result for long.
func drainWait(p *process) {
	ch := make(chan struct{})
	go func() { p.drained.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(markerWait):
	}
}

func exitDescription(err error) string {
	if err == nil {
		return "exit code 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Signaled():
				return fmt.Sprintf("killed by signal %d, %s", ws.Signal(), ws.Signal())
			case ws.Exited():
				return fmt.Sprintf("exit code %d", ws.ExitStatus())
			}
		}
	}
	return err.Error()
}

// displayCollector keeps a run's rich results. The REPL server bounds them
// (per result and per run); the agent holds it to that, since the code
// runs in the same process and can write frames of its own.
type displayCollector struct {
	list  []protocol.Display
	bytes int
}

func (c *displayCollector) add(frame []byte, tooLarge bool) (protocol.Display, bool) {
	var d protocol.Display
	if tooLarge || c.bytes+len(frame) > protocol.DefaultMaxRunDisplayBytes+protocol.DefaultMaxDisplayBytes {
		note, _ := json.Marshal(fmt.Sprintf("[a rich result was left out: over the agent's limit of %d MiB per run]",
			protocol.DefaultMaxRunDisplayBytes>>20))
		d.Data = map[string]json.RawMessage{"text/plain": note}
	} else if err := json.Unmarshal(frame, &d); err != nil || d.Data == nil {
		return d, false // not a frame of the REPL server's
	}
	if _, ok := d.Data["text/plain"]; !ok {
		d.Data["text/plain"] = json.RawMessage(`""`)
	}
	c.bytes += len(frame)
	c.list = append(c.list, d)
	return d, true
}
