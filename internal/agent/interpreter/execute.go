package interpreter

import (
	"encoding/json"
	"fmt"
	"strconv"
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
// another execution runs. Timeouts, interrupts and interpreter deaths are
// results, not errors.
func (it *Interpreter) Execute(req protocol.ExecuteRequest, hooks Hooks) (*protocol.Result, error) {
	if !it.busy.TryLock() {
		return nil, ErrBusy
	}
	defer it.busy.Unlock()

	res := &protocol.Result{ID: req.ID, StartedAt: time.Now()}
	finish := func() *protocol.Result { return res.Finish(time.Now()) }
	p, err := it.ensure()
	if err != nil {
		res.Status = protocol.StatusFailed
		res.StateLost = true
		res.Error = &protocol.Error{Type: protocol.ErrorInterpreterDied, Message: "the interpreter could not start: " + err.Error()}
		return finish(), nil
	}
	res.Interpreter = p.tag
	if req.Interpreter != "" && req.Interpreter != p.tag {
		// The caller's state lived in an interpreter that died or was replaced:
		// running on this one would silently start from nothing.
		res.Status = protocol.StatusFailed
		res.StateLost = true
		res.Error = &protocol.Error{Type: protocol.ErrorInterpreterRestarted, Message: "the interpreter that held this session's " +
			"state died or was replaced since its last run; the code did not run"}
		return finish(), nil
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
	id := newID() // see the package comment: the code cannot know it in advance
	p.expect(id)
	defer p.expect("")
	drainStale(p)
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
		"code": req.Code, "env": req.Env, "marker": string(marker), "bridge": req.Bridge && hooks.OnBridge != nil,
		"max_bridge_calls": maxBridge, "max_result_chars": it.cfg.MaxResultChars,
		"clear_interrupt": p.strayInterrupt, "display": string(displayStart),
		"max_display_bytes": protocol.DefaultMaxDisplayBytes, "max_run_display_bytes": protocol.DefaultMaxRunDisplayBytes,
	}
	p.strayInterrupt = false
	if len(req.Context) > 0 {
		params["context"] = req.Context
	}
	if params["bridge"] == true && len(req.BridgeMethods) > 0 {
		params["bridge_methods"] = req.BridgeMethods
	}
	res.StartedAt = time.Now()
	if err := p.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": "execute", "params": params}); err != nil {
		// The process died between ensure and send.
		p.kill()
	}

	var memory *memoryWatch
	if it.cfg.Limits.MemoryBytes > 0 {
		memory = &memoryWatch{budget: it.cfg.Limits.MemoryBytes}
		stopWatch := make(chan struct{})
		defer close(stopWatch)
		go memory.watch(p, stopWatch)
	}

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var graceC <-chan time.Time
	var stopReason protocol.Status // set once SIGINT was sent by us
	killed := false
	sigint := func(reason protocol.Status) {
		if stopReason != "" {
			return
		}
		stopReason = reason
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		graceC = time.After(grace)
	}
	want := strconv.Quote(id)
	var reply json.RawMessage
loop:
	for {
		select {
		case m, ok := <-p.msgs:
			if !ok {
				break loop // the interpreter died
			}
			switch {
			case m.Method != "":
				if m.Run == id {
					it.bridge(p, m, hooks, done)
				}
			case string(m.ID) == want:
				reply = m.Result
				if m.Error != nil {
					reply = nil
					res.Error = &protocol.Error{Type: "AgentError", Message: m.Error.Message}
				}
				break loop
			}
		case <-p.exited:
			break loop
		case <-deadline.C:
			sigint(protocol.StatusTimedOut)
		case <-interrupt:
			sigint(protocol.StatusInterrupted)
		case <-graceC:
			killed = true
			p.kill()
		}
	}

	if reply != nil || res.Error != nil {
		waitMarkers(outSeen, errSeen)
	} else {
		// Dead: read what it wrote before it died, then start a fresh one.
		<-p.exited
		drainWait(p)
	}
	p.stdout.detach()
	p.stderr.detach()
	res.Displays = displays.list
	res.Stdout, res.StdoutTruncated = stdout.String("stdout"), stdout.Truncated()
	res.Stderr, res.StderrTruncated = stderr.String("stderr"), stderr.Truncated()

	if reply == nil && res.Error == nil {
		res.StateLost = true
		it.restartAsync()
		switch {
		case memory != nil && memory.overError() != "":
			res.Status = protocol.StatusFailed
			res.Error = &protocol.Error{Type: ErrorMemoryLimitExceeded, Message: memory.overError()}
		case killed:
			res.Status = stopReason
			res.Error = &protocol.Error{Type: protocol.ErrorInterpreterKilled, Message: fmt.Sprintf(
				"the code did not stop within %s after SIGINT, so the interpreter was killed and a fresh one started: "+
					"variables and imports of earlier executions are lost", grace)}
		default:
			res.Status = protocol.StatusFailed
			if stopReason != "" {
				res.Status = stopReason
			}
			res.Error = &protocol.Error{Type: protocol.ErrorInterpreterDied, Message: fmt.Sprintf(
				"the interpreter died (%s), so a fresh one was started: variables and imports of earlier executions are lost",
				exitDescription(p.waitErr))}
		}
		return finish(), nil
	}
	if res.Error != nil { // the REPL server refused the request
		res.Status = protocol.StatusFailed
		return finish(), nil
	}
	var r struct {
		Status string          `json:"status"`
		Result *string         `json:"result"`
		Error  *protocol.Error `json:"error"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return nil, fmt.Errorf("decode interpreter reply: %w", err)
	}
	res.Result, res.Error = r.Result, r.Error
	p.strayInterrupt = stopReason != "" && r.Status != "interrupted"
	switch r.Status {
	case "ok":
		res.Status = protocol.StatusSucceeded
	case "final":
		res.Status, res.Final = protocol.StatusSucceeded, true
	case "interrupted":
		res.Status = stopReason
		if stopReason == "" { // the code raised KeyboardInterrupt itself
			res.Status = protocol.StatusFailed
		}
	default:
		res.Status = protocol.StatusFailed
	}
	return finish(), nil
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
		return "exit status 0"
	}
	if ee, ok := err.(interface{ Sys() any }); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d, %s", ws.Signal(), ws.Signal())
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
