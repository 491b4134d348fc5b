// Package interpreter supervises one warm Python interpreter: it starts the
// embedded REPL server, speaks JSON-RPC with it on pipes of their own (fd 3 and
// 4), captures the user's fd 1 and 2, interrupts with SIGINT, and kills and
// restarts the interpreter when it does not stop or dies.
//
// The code runs in the REPL server's process, so it can write to the protocol
// pipe and read the server's memory: it can always lie about its own execution.
// It must not be able to lie about a later one, nor to hurt the agent:
//
//   - Every request gets a fresh id of 128 random bits (newID). A reply counts
//     only if it carries the id of the request in flight, a bridge call only if
//     its "run" is that id (process.accepts); everything else is dropped as it
//     is read. The code can find the id of its own request (it is in a frame of
//     the server loop), but not the id of the next one, which does not exist
//     before its own execution ended. (A thread the code leaves running is the
//     code still running: it shares the process with every later execution.)
//   - Messages are lines of at most MaxMessageBytes; a longer line is dropped
//     while it is read, without holding more than the limit in memory. The REPL
//     server starts every message on a new line, so a fragment the code left on
//     the pipe spoils only itself. What is logged of a dropped message is cut to
//     logSample bytes, and only the first few and then every 1000th are logged.
package interpreter

import (
	"bufio"
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/warmpool/warmpool/internal/agent/procs"
	"github.com/warmpool/warmpool/pkg/protocol"
)

//go:embed replserver.py
var replServer string

// ErrBusy is returned when the interpreter already runs something.
var ErrBusy = errors.New("the interpreter is busy with another execution; wait for it to finish or interrupt it")

// Config of an interpreter.
type Config struct {
	// Python is the interpreter binary; default "python3".
	Python string
	// Preload lists modules imported before the interpreter is ready.
	Preload []string
	// Dir is the working directory of the code (the workspace).
	Dir string
	// Env is the interpreter's environment; default the agent's own.
	Env []string
	// ReadyTimeout bounds start-up including preloads; default 2 minutes.
	ReadyTimeout time.Duration
	// Defaults for requests that leave them zero.
	DefaultTimeout        time.Duration
	DefaultGrace          time.Duration
	DefaultMaxOutputBytes int
	DefaultMaxBridgeCalls int
	// MaxResultChars bounds the repr or FINAL value of a result.
	MaxResultChars int
	// MaxMessageBytes bounds one message from the REPL server (a reply or a
	// bridge call); default 16 MiB.
	MaxMessageBytes int
	// MaxVariableBytes bounds the JSON of a variable that Variable returns;
	// default DefaultMaxVariableBytes.
	MaxVariableBytes int
	// VariableTimeout bounds how long Variable waits for the interpreter
	// before it interrupts it (a __repr__ that never returns); default 10 s.
	VariableTimeout time.Duration
	// Limits bound the memory and processes of the code (limits.go).
	Limits Limits
	Log    logr.Logger
}

// DefaultMaxVariableBytes is the default bound of Variable's JSON.
const DefaultMaxVariableBytes = 4 << 20

// VariableTooLargeError says a variable's JSON is larger than the limit.
type VariableTooLargeError struct {
	Name  string
	Limit int
}

func (e *VariableTooLargeError) Error() string {
	return fmt.Sprintf("variable %q is larger than %d bytes as JSON; read a part of it (for example a slice) into a smaller variable",
		e.Name, e.Limit)
}

func (c *Config) setDefaults() {
	if c.Python == "" {
		c.Python = "python3"
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 2 * time.Minute
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = protocol.DefaultTimeout
	}
	if c.DefaultGrace == 0 {
		c.DefaultGrace = protocol.DefaultGrace
	}
	if c.DefaultMaxOutputBytes == 0 {
		c.DefaultMaxOutputBytes = protocol.DefaultMaxOutputBytes
	}
	if c.DefaultMaxBridgeCalls == 0 {
		c.DefaultMaxBridgeCalls = 16
	}
	if c.MaxResultChars == 0 {
		c.MaxResultChars = 64 * 1024
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 16 << 20
	}
	if c.MaxVariableBytes == 0 {
		c.MaxVariableBytes = DefaultMaxVariableBytes
	}
	if c.VariableTimeout == 0 {
		c.VariableTimeout = 10 * time.Second
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
}

// Hooks let a caller follow an execution as it runs.
type Hooks struct {
	// OnStdout and OnStderr see output as it arrives (within the byte limit).
	OnStdout, OnStderr func([]byte)
	// OnDisplay sees each rich result, after the output printed before it.
	OnDisplay func(protocol.Display)
	// Interrupted reports an interrupt asked for before the run began: the
	// caller records it before calling Interrupt, which finds no run then
	// (the agent may still be preparing it: a reset, the workspace's walk).
	Interrupted func() bool
	// OnBridge answers llm_query/rlm_query. It runs in its own goroutine and
	// should return when done is closed (the execution ended).
	OnBridge func(call protocol.BridgeCall, done <-chan struct{}) (json.RawMessage, error)
}

// Interpreter is one supervised Python process, restarted when needed.
type Interpreter struct {
	cfg  Config
	busy sync.Mutex // one execution (or variable read, or reset) at a time

	mu        sync.Mutex
	proc      *process
	startErr  error
	interrupt chan struct{} // non-nil while an execution runs
}

// New returns an interpreter; Start (or the first use) starts the process.
func New(cfg Config) *Interpreter {
	cfg.setDefaults()
	return &Interpreter{cfg: cfg}
}

type rpcMessage struct {
	ID json.RawMessage `json:"id,omitempty"`
	// Run is the id of the request a bridge call belongs to.
	Run    string          `json:"run,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// ReadyInfo is what the interpreter reports once warm.
type ReadyInfo struct {
	// Tag identifies this process of the interpreter (Result.Interpreter).
	Tag       string            `json:"-"`
	Python    string            `json:"python"`
	PID       int               `json:"pid"`
	Preloaded []string          `json:"preloaded"`
	Failed    map[string]string `json:"failed"`
}

type process struct {
	cmd            *exec.Cmd
	tag            string // in the environment of every process the interpreter starts (procs.go)
	writeMu        sync.Mutex
	req            *os.File
	msgs           chan rpcMessage
	exited         chan struct{}
	waitErr        error
	stdout, stderr stream
	drained        sync.WaitGroup // the output readers hit EOF
	info           ReadyInfo
	// strayInterrupt: the last run was sent a SIGINT that it did not end
	// with, which may have landed after its code and would stop the next
	// run's code before it starts. Only Execute, one run at a time, uses it.
	strayInterrupt bool

	mu      sync.Mutex
	ready   bool   // the ready message arrived
	current string // quoted id of the request in flight; "" when none
	dropped int    // messages dropped, for the log
}

// expect makes id the request in flight ("" for none); messages for any other
// request are dropped from then on.
func (p *process) expect(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = ""
	if id != "" {
		p.current = strconv.Quote(id)
	}
}

// accepts says whether a message from the interpreter belongs to the request
// in flight (or is the ready message of a starting interpreter).
func (p *process) accepts(m *rpcMessage) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.ready:
		p.ready = m.Method == "ready"
		return p.ready
	case p.current == "":
		return false
	case m.Method != "":
		return strconv.Quote(m.Run) == p.current
	default:
		return string(m.ID) == p.current
	}
}

// logSample is how much of a dropped message the log shows.
const logSample = 120

// drop logs a message it drops: the first five, then every 1000th.
func (p *process) drop(log logr.Logger, reason string, size int, start []byte) {
	p.mu.Lock()
	p.dropped++
	n := p.dropped
	p.mu.Unlock()
	if n <= 5 || n%1000 == 0 {
		log.Info("dropped a message from the interpreter", "reason", reason, "bytes", size,
			"start", string(start[:min(len(start), logSample)]), "droppedSoFar", n)
	}
}

// readMessages reads the interpreter's messages until EOF and passes on those
// of the request in flight.
func (it *Interpreter) readMessages(p *process, r io.Reader) {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, size, err := readLine(br, it.cfg.MaxMessageBytes)
		switch {
		case size > it.cfg.MaxMessageBytes:
			p.drop(it.cfg.Log, fmt.Sprintf("longer than %d bytes", it.cfg.MaxMessageBytes), size, line)
		case len(bytes.TrimSpace(line)) == 0:
		default:
			var m rpcMessage
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				p.drop(it.cfg.Log, "not JSON-RPC: "+jerr.Error(), size, line)
			} else if !p.accepts(&m) {
				p.drop(it.cfg.Log, "not for the request in flight", size, line)
			} else {
				select {
				case p.msgs <- m:
				case <-p.exited:
				}
			}
		}
		if err != nil {
			return
		}
	}
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

// newID is a request id the code cannot guess.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *process) send(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	_, err = p.req.Write(append(b, '\n'))
	return err
}

func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill ends the interpreter and every process it started (procs.go).
func (p *process) kill() {
	killProcesses(p.cmd.Process.Pid, p.tag)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// outputPipe makes a pipe for the interpreter's stdout or stderr whose read
// end blocks in read(2) instead of joining Go's poller: a poller's epoll
// registration is woken by every write, and code that prints in a loop would
// pay that per line (stream.run lets a busy pipe gather output instead).
func outputPipe() (r, w *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

func (it *Interpreter) spawn() (*process, error) {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := outputPipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := outputPipe()
	if err != nil {
		return nil, err
	}
	tag := newID()
	cmd := exec.Command(it.cfg.Python, "-u", "-c", replServer)
	cmd.Dir = it.cfg.Dir
	cmd.Env = append(append([]string{}, it.cfg.Env...), "WARMPOOL_PRELOAD="+strings.Join(it.cfg.Preload, ","),
		tagVar+"="+tag, fmt.Sprintf("WARMPOOL_MAX_MESSAGE_BYTES=%d", it.cfg.MaxMessageBytes))
	cmd.Env = append(cmd.Env, it.cfg.Limits.env(cmd.Env)...)
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = []*os.File{reqR, respW} // fd 3, fd 4
	// Own process group: SIGKILL reaches subprocesses of the code too; Pdeathsig:
	// the interpreter never outlives the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	procs.BecomeSubreaper() // see procs.go
	err = procs.Start(cmd)
	for _, f := range []*os.File{reqR, respW, outW, errW} {
		_ = f.Close()
	}
	if err != nil {
		for _, f := range []*os.File{reqW, respR, outR, errR} {
			_ = f.Close()
		}
		return nil, fmt.Errorf("start %s: %w", it.cfg.Python, err)
	}
	p := &process{cmd: cmd, tag: tag, req: reqW, msgs: make(chan rpcMessage, 16), exited: make(chan struct{})}
	// Before the interpreter reads its first request, so no code runs unlimited.
	limitErr := applyLimits(cmd.Process.Pid, it.cfg.Limits)
	p.drained.Add(2)
	go func() { defer p.drained.Done(); p.stdout.run(outR); _ = outR.Close() }()
	go func() { defer p.drained.Done(); p.stderr.run(errR); _ = errR.Close() }()
	go func() {
		defer close(p.msgs)
		defer func() { _ = respR.Close() }()
		it.readMessages(p, respR)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		procs.Done(cmd.Process.Pid)
		// What it started lives on elsewhere when it died by itself: end it too,
		// before anyone waits for the output pipes those processes hold.
		killProcesses(0, tag)
		_ = reqW.Close()
		close(p.exited)
	}()

	if limitErr != nil {
		p.kill()
		return nil, limitErr
	}

	timer := time.NewTimer(it.cfg.ReadyTimeout)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-p.msgs:
			if !ok {
				<-p.exited
				return nil, fmt.Errorf("interpreter exited during start-up (%v); stderr is the pod's log", p.waitErr)
			}
			if m.Method == "ready" {
				if err := json.Unmarshal(m.Params, &p.info); err != nil {
					p.kill()
					return nil, fmt.Errorf("bad ready message: %w", err)
				}
				return p, nil
			}
		case <-timer.C:
			p.kill()
			return nil, fmt.Errorf("interpreter not ready after %s (preloads: %v)", it.cfg.ReadyTimeout, it.cfg.Preload)
		}
	}
}

// Start starts the interpreter if it is not running and waits until it is warm.
func (it *Interpreter) Start() error {
	_, err := it.ensure()
	return err
}

func (it *Interpreter) ensure() (*process, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.proc != nil && it.proc.alive() {
		return it.proc, nil
	}
	start := time.Now()
	p, err := it.spawn()
	it.proc, it.startErr = p, err
	if err != nil {
		return nil, err
	}
	it.cfg.Log.V(1).Info("interpreter ready", "pid", p.info.PID, "python", p.info.Python,
		"preloaded", p.info.Preloaded, "startup", time.Since(start))
	if len(p.info.Failed) > 0 {
		it.startErr = fmt.Errorf("preload failed: %v", p.info.Failed)
	}
	return p, nil
}

// Ready reports whether the interpreter is warm with all preloads imported.
func (it *Interpreter) Ready() (ReadyInfo, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.startErr != nil {
		return ReadyInfo{}, it.startErr
	}
	if it.proc == nil || !it.proc.alive() {
		return ReadyInfo{}, errors.New("interpreter is starting")
	}
	info := it.proc.info
	info.Tag = it.proc.tag
	return info, nil
}

// Busy reports whether an execution runs.
func (it *Interpreter) Busy() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.interrupt != nil
}

// restartAsync replaces a dead interpreter in the background, so the next
// execution finds a warm one.
func (it *Interpreter) restartAsync() {
	go func() {
		if _, err := it.ensure(); err != nil {
			it.cfg.Log.Error(err, "restart interpreter")
		}
	}()
}

// Interrupt sends SIGINT to the running execution; false when nothing runs.
func (it *Interpreter) Interrupt() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.interrupt == nil {
		return false
	}
	select {
	case it.interrupt <- struct{}{}:
	default:
	}
	return true
}

// Close kills the interpreter.
func (it *Interpreter) Close() {
	it.mu.Lock()
	p := it.proc
	it.proc = nil
	it.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// Reset replaces the interpreter with a fresh one: all state is gone.
func (it *Interpreter) Reset() error {
	if !it.busy.TryLock() {
		return ErrBusy
	}
	defer it.busy.Unlock()
	it.Close()
	_, err := it.ensure()
	return err
}

// call sends one request and waits for its response (not for executions).
func (it *Interpreter) call(method string, params any, timeout time.Duration) (json.RawMessage, error) {
	p, err := it.ensure()
	if err != nil {
		return nil, err
	}
	id := newID()
	p.expect(id)
	defer p.expect("")
	drainStale(p)
	if err := p.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params}); err != nil {
		return nil, fmt.Errorf("send %s: %w", method, err)
	}
	want := strconv.Quote(id)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var graceC <-chan time.Time
	for {
		select {
		case m, ok := <-p.msgs:
			if !ok {
				return nil, fmt.Errorf("%s: the interpreter died, and the state with it", method)
			}
			if m.Method == "" && string(m.ID) == want {
				if m.Error != nil {
					return nil, errors.New(m.Error.Message)
				}
				if graceC != nil {
					return nil, fmt.Errorf("%s: interrupted after %s (the value's __repr__ or JSON did not finish)", method, timeout)
				}
				return m.Result, nil
			}
		case <-timer.C:
			// Code of the user's runs in the interpreter (a __repr__ that never
			// returns): interrupt it as a run is, or the next run finds the
			// interpreter still busy and is killed for it.
			_ = p.cmd.Process.Signal(syscall.SIGINT)
			graceC = time.After(it.cfg.DefaultGrace)
		case <-graceC:
			p.kill()
			<-p.exited
			it.restartAsync()
			return nil, fmt.Errorf("%s: no answer within %s nor after SIGINT, so the interpreter was killed and a fresh one "+
				"started: the state is lost", method, timeout)
		}
	}
}

// Variable returns a global of the interpreter: found, and its JSON or repr.
func (it *Interpreter) Variable(name string) (*protocol.Variable, bool, error) {
	if !it.busy.TryLock() {
		return nil, false, ErrBusy
	}
	defer it.busy.Unlock()
	limit := it.cfg.MaxVariableBytes
	raw, err := it.call("get_variable", map[string]any{"name": name, "max_bytes": limit}, it.cfg.VariableTimeout)
	if err != nil {
		return nil, false, err
	}
	var v struct {
		Found    bool            `json:"found"`
		TooLarge bool            `json:"too_large"`
		JSON     json.RawMessage `json:"json"`
		Repr     string          `json:"repr"`
		Type     string          `json:"type"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false, err
	}
	if !v.Found {
		return nil, false, nil
	}
	if v.TooLarge || len(v.JSON) > limit {
		return nil, true, &VariableTooLargeError{Name: name, Limit: limit}
	}
	return &protocol.Variable{Name: name, Type: v.Type, JSON: v.JSON, Repr: v.Repr}, true, nil
}

// newMarkers returns a run's end marker and the start of its display frames.
func newMarkers() (end, display []byte) {
	id := newID()
	return []byte("\x1ewarmpool-end-" + id + "\x1e"), []byte("\x1ewarmpool-display-" + id + "\x1e")
}

// drainStale drops messages left over from an earlier request.
func drainStale(p *process) {
	for {
		select {
		case _, ok := <-p.msgs:
			if !ok {
				return
			}
		default:
			return
		}
	}
}
