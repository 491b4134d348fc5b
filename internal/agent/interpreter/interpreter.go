// Package interpreter supervises one warm Python interpreter: it starts the
// embedded REPL server, speaks JSON-RPC with it on pipes of their own (fd 3 and
// 4), captures the user's fd 1 and 2, interrupts with SIGINT, and kills and
// restarts the interpreter when it does not stop, dies or breaks the protocol.
//
// The code runs in the REPL server's process, so it can write to the protocol
// pipe and read the server's memory: it can always lie about its own execution.
// It must not be able to lie about a later one, stretch its run, lose state
// without a word, nor hurt the agent. docs/security.md states the invariants
// the agent keeps against it; each is kept here:
//
//   - The deadline is the agent's (execute.go): SIGINT at the timeout, then,
//     after the grace, SIGKILL of the interpreter's whole process tree. Every
//     wait on the interpreter has a deadline of its own.
//   - The agent knows its interpreter's generation (process.gen): every death,
//     exit or replacement, while running or idle, is recorded with its reason
//     and reported as stateLost by the next result; an idle interpreter that
//     ended is restarted at once.
//   - Replies belong to their run (channel.go): a per-run secret, and anything
//     else on the channel ends the interpreter.
//   - Nothing the code left running can read a request or answer for it
//     (foreign.go): before each request the agent looks for threads and
//     processes the code left behind, and replaces an interpreter that has any.
//   - The interpreter runs in its own user and PID namespaces where the kernel
//     allows it (containment.go): the code cannot name the agent's process to
//     signal or trace it, and the interpreter's death ends every process it
//     started.
package interpreter

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
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
	// NoNamespaces starts the interpreter in the agent's own namespaces
	// (containment.go), as where the kernel refuses new ones.
	NoNamespaces bool
	Log          logr.Logger
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
	busy sync.Mutex // one execution (or variable read, snapshot, reset) at a time
	// startMu serialises starts; mu is not held while a process starts, so
	// readiness and interrupts answer meanwhile.
	startMu sync.Mutex

	mu        sync.Mutex
	proc      *process
	startErr  error
	interrupt chan struct{} // non-nil while an execution runs
	closed    bool          // Close was called: nothing restarts
	gens      uint64        // processes started so far
	// served is the generation of the process whose state the last run left
	// (0: none, or its loss was reported); lost is why that process ended.
	served uint64
	lost   string
	// lastEnd is why the last interpreter that was current ended.
	lastEnd string
	// contain is how the interpreter is kept apart (containment.go), decided
	// at the first start.
	contain containment
	// channelGrace is how long a closed channel waits for the process's end
	// before it counts as a violation (default channelGrace).
	channelGrace time.Duration
}

// New returns an interpreter; Start (or the first use) starts the process.
func New(cfg Config) *Interpreter {
	cfg.setDefaults()
	return &Interpreter{cfg: cfg, channelGrace: channelGrace}
}

// ReadyInfo is what the interpreter reports once warm.
type ReadyInfo struct {
	// Tag identifies this process of the interpreter (Result.Interpreter).
	Tag       string            `json:"-"`
	Python    string            `json:"python"`
	PID       int               `json:"pid"`
	Preloaded []string          `json:"preloaded"`
	Failed    map[string]string `json:"failed"`
	// Containment says how the interpreter is kept apart from the agent.
	Containment string `json:"-"`
}

type process struct {
	cmd            *exec.Cmd
	tag            string // in the environment of every process the interpreter starts (procs.go)
	gen            uint64
	writeMu        sync.Mutex
	req            *os.File
	msgs           chan rpcMessage
	exited         chan struct{}
	waitErr        error
	stdout, stderr stream
	drained        sync.WaitGroup // the output readers hit EOF
	info           ReadyInfo
	// threads is how many threads the REPL server had when it was ready (its
	// own, and the preloaded libraries'); pipes are the inodes of the channel's
	// two pipes (foreign.go).
	threads int
	pipes   [2]uint64
	// contained: the interpreter is the init of a PID namespace of its own.
	contained bool
	// strayInterrupt: the last run was sent a SIGINT that it did not end
	// with, which may have landed after its code and would stop the next
	// run's code before it starts. Only Execute, one run at a time, uses it.
	strayInterrupt bool
	abandoned      atomic.Bool // not to be used: it exited, or did not go when killed
	noProcess      sync.Once
	recorded       atomic.Bool // its end was recorded (exited)

	mu    sync.Mutex
	ready bool    // the ready message arrived
	key   *runKey // the request in flight; nil when none
	// Bridge calls of the request in flight: unanswered, made, allowed.
	bridgePending, bridgeCalls, maxBridge int
	// endType and end say why the agent ended the process ("" while it did not).
	endType, end string
}

func (p *process) pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// expect makes key the request in flight (nil for none), allowing it
// maxBridge bridge calls.
func (p *process) expect(key *runKey, maxBridge int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.key, p.bridgePending, p.bridgeCalls, p.maxBridge = key, 0, 0, maxBridge
}

// setEnd records why the agent ends the process; false if a reason was
// recorded already.
func (p *process) setEnd(kind, reason string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != "" {
		return false
	}
	p.endType, p.end = kind, reason
	return true
}

// ending is why the process ended: the reason the agent recorded, or how it
// exited. Call once exited is closed.
func (p *process) ending() (kind, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != "" {
		return p.endType, p.end
	}
	return protocol.ErrorInterpreterDied, "the interpreter ended by itself (" + exitDescription(p.waitErr) + ")"
}

// sendTimeout bounds writing one message to the interpreter: a pipe whose
// reader stopped reading blocks the writer once full.
const sendTimeout = 10 * time.Second

func (p *process) send(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	_ = p.req.SetWriteDeadline(time.Now().Add(sendTimeout))
	_, err = p.req.Write(append(b, '\n'))
	return err
}

func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return !p.abandoned.Load()
	}
}

// killWait bounds how long a kill waits for the process to be gone.
const killWait = 10 * time.Second

// kill ends the interpreter and every process it started (procs.go) and
// waits, within killWait, until it is gone. Safe to call more than once.
func (p *process) kill() {
	p.setEnd(protocol.ErrorInterpreterKilled, "the agent killed the interpreter")
	if p.cmd == nil { // the channel's tests: a process without a process
		p.noProcess.Do(func() { close(p.exited) })
		return
	}
	if !p.contained { // a namespace's init takes every process of it along
		killProcesses(p.pid(), p.tag)
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(killWait):
		// Not gone after SIGKILL (a process stuck in the kernel): it serves
		// nothing more, and a fresh one takes its place.
		p.abandoned.Store(true)
	}
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

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

func (it *Interpreter) spawn() (*process, error) {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		closeAll(reqR, reqW)
		return nil, err
	}
	outR, outW, err := outputPipe()
	if err != nil {
		closeAll(reqR, reqW, respR, respW)
		return nil, err
	}
	errR, errW, err := outputPipe()
	if err != nil {
		closeAll(reqR, reqW, respR, respW, outR, outW)
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
	procs.BecomeSubreaper()                  // see procs.go
	err = it.startRetrying(cmd)
	closeAll(reqR, respW, outW, errW)
	if err != nil {
		closeAll(reqW, respR, outR, errR)
		return nil, fmt.Errorf("start %s: %w", it.cfg.Python, err)
	}
	it.mu.Lock()
	it.gens++
	gen, contained := it.gens, it.contain == containNamespaces
	it.mu.Unlock()
	p := &process{cmd: cmd, tag: tag, gen: gen, contained: contained, req: reqW, msgs: make(chan rpcMessage, 16), exited: make(chan struct{})}
	p.pipes = [2]uint64{inode(reqW), inode(respR)}
	// Before the interpreter reads its first request, so no code runs unlimited.
	limitErr := applyLimits(cmd.Process.Pid, it.cfg.Limits)
	p.drained.Add(2)
	go func() { defer p.drained.Done(); p.stdout.run(outR); _ = outR.Close() }()
	go func() { defer p.drained.Done(); p.stderr.run(errR); _ = errR.Close() }()
	go func() {
		defer func() { _ = respR.Close() }()
		it.readMessages(p, respR)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		p.abandoned.Store(true) // no request goes to it from now on, before the sweep below
		procs.Done(cmd.Process.Pid)
		// What it started lives on elsewhere when it died by itself: end it too,
		// before anyone waits for the output pipes those processes hold (in
		// its own PID namespace the kernel did).
		if !p.contained {
			killProcesses(0, tag)
		}
		_ = reqW.Close()
		close(p.exited)
		it.exited(p)
	}()

	if limitErr != nil {
		p.setEnd(protocol.ErrorInterpreterDied, limitErr.Error())
		p.kill()
		return nil, limitErr
	}

	timer := time.NewTimer(it.cfg.ReadyTimeout)
	defer timer.Stop()
	select {
	case m := <-p.msgs:
		if err := json.Unmarshal(m.Params, &p.info); err != nil {
			p.kill()
			return nil, fmt.Errorf("bad ready message: %w", err)
		}
		p.info.Containment = it.contain.String()
		p.threads = threadCount(p.pid())
		return p, nil
	case <-p.exited:
		_, why := p.ending()
		return nil, fmt.Errorf("interpreter exited during start-up: %s; stderr is the pod's log", why)
	case <-timer.C:
		p.kill()
		return nil, fmt.Errorf("interpreter not ready after %s (preloads: %v)", it.cfg.ReadyTimeout, it.cfg.Preload)
	}
}

// exited records the end of a process. The current one's end is what the
// next run reports as the reason its state was lost; an idle interpreter
// is restarted at once, so that readiness says the truth.
func (it *Interpreter) exited(p *process) {
	if !p.recorded.CompareAndSwap(false, true) {
		return // prepare records a process it replaces before its waiter does
	}
	kind, why := p.ending()
	it.mu.Lock()
	current := it.proc == p
	if current && p.gen == it.served && it.lost == "" {
		it.lost = why
	}
	if current {
		it.lastEnd = why
	}
	restart := current && !it.closed && it.interrupt == nil
	it.mu.Unlock()
	if current {
		it.cfg.Log.Info("interpreter ended", "pid", p.pid(), "generation", p.gen, "why", why, "type", kind)
	}
	if restart {
		it.restartAsync()
	}
}

// Start starts the interpreter if it is not running and waits until it is warm.
func (it *Interpreter) Start() error {
	_, err := it.ensure()
	return err
}

func (it *Interpreter) current() *process {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.proc != nil && it.proc.alive() {
		return it.proc
	}
	return nil
}

func (it *Interpreter) ensure() (*process, error) {
	if p := it.current(); p != nil {
		return p, nil
	}
	it.startMu.Lock()
	defer it.startMu.Unlock()
	if p := it.current(); p != nil {
		return p, nil
	}
	it.mu.Lock()
	closed := it.closed
	it.mu.Unlock()
	if closed {
		return nil, errors.New("the agent is shutting down")
	}
	start := time.Now()
	p, err := it.spawn()
	it.mu.Lock()
	it.proc, it.startErr = p, err
	if err == nil && len(p.info.Failed) > 0 {
		it.startErr = fmt.Errorf("preload failed: %v", p.info.Failed)
	}
	it.mu.Unlock()
	if err != nil {
		return nil, err
	}
	it.cfg.Log.V(1).Info("interpreter ready", "pid", p.pid(), "python", p.info.Python, "generation", p.gen,
		"preloaded", p.info.Preloaded, "containment", p.info.Containment, "startup", time.Since(start))
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

// LastEnd says why the last interpreter ended by itself or was ended by the
// agent (not by a reset), "" if none did.
func (it *Interpreter) LastEnd() string {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.lastEnd
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

// Close kills the interpreter; nothing restarts it.
func (it *Interpreter) Close() {
	it.mu.Lock()
	p := it.proc
	it.proc, it.closed = nil, true
	it.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// Reset replaces the interpreter with a fresh one: all state is gone, as the
// caller asked, so the next run does not report it lost.
func (it *Interpreter) Reset() error { return it.ResetWith(nil) }

// ResetWith is Reset that runs between while no interpreter runs (the old one
// and every process it started are gone, the new one not started): a
// hand-over's sweep.
func (it *Interpreter) ResetWith(between func()) error {
	if !it.busy.TryLock() {
		return ErrBusy
	}
	defer it.busy.Unlock()
	it.startMu.Lock()
	it.mu.Lock()
	p := it.proc
	it.proc, it.served, it.lost = nil, 0, ""
	it.mu.Unlock()
	if p != nil {
		p.setEnd(protocol.ErrorInterpreterKilled, "the interpreter was reset")
		p.kill()
	}
	if between != nil {
		between()
	}
	it.startMu.Unlock()
	_, err := it.ensure()
	return err
}

// prepare returns the process a request goes to, after replacing one that
// something the code left running could answer for (foreign.go). lost is why
// the state the last run left is gone ("" when it is not).
func (it *Interpreter) prepare() (p *process, lost string, err error) {
	p, err = it.ensure()
	if err != nil {
		return nil, "", err
	}
	if why := foreignPresence(p); why != "" {
		p.setEnd(ErrorForeignPresence, why)
		it.cfg.Log.Info("replacing the interpreter before a request", "why", why, "pid", p.pid())
		p.kill()
		it.exited(p) // recorded before the new process is current (exited may still be on its way)
		if p, err = it.ensure(); err != nil {
			return nil, "", err
		}
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.served != 0 && it.served != p.gen {
		lost = it.lost
		if lost == "" {
			lost = "the interpreter was replaced"
		}
	}
	return p, lost, nil
}

// servedBy records the process whose state the last request left; 0 when
// that request reported the state lost itself.
func (it *Interpreter) servedBy(gen uint64) {
	it.mu.Lock()
	it.served, it.lost = gen, ""
	it.mu.Unlock()
}

// call sends one request and waits for its response (not for executions).
func (it *Interpreter) call(method string, params any, timeout time.Duration) (json.RawMessage, error) {
	p, lost, err := it.prepare()
	if err != nil {
		return nil, err
	}
	if lost != "" {
		// Said here, and by the next run too (served is left as it is).
		return nil, fmt.Errorf("%s: the interpreter's state is lost (%s)", method, lost)
	}
	key := newRunKey()
	p.expect(key, 0)
	defer p.expect(nil, 0)
	if err := p.send(map[string]any{"jsonrpc": "2.0", "id": key.id, "secret": key.secret, "method": method, "params": params}); err != nil {
		it.violation(p, "it did not read the agent's request: "+err.Error(), nil)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var graceC, killC <-chan time.Time
	for {
		select {
		case m := <-p.msgs:
			if check(&m, key, true) != "" || m.Method != "" {
				it.violation(p, "a message that is not the reply to "+method, nil)
				continue
			}
			if m.Error != nil {
				return nil, errors.New(m.Error.Message)
			}
			if graceC != nil {
				return nil, fmt.Errorf("%s: interrupted after %s (the value's __repr__ or JSON did not finish)", method, timeout)
			}
			p.closeRequest(it)
			if method == "restore" { // the state is the snapshot's now, and lives in this process
				it.servedBy(p.gen)
			}
			return m.Result, nil
		case <-p.exited:
			_, why := p.ending()
			return nil, fmt.Errorf("%s: %s, so a fresh one was started: the state is lost", method, why)
		case <-timer.C:
			// Code of the user's runs in the interpreter (a __repr__ that never
			// returns): interrupt it as a run is, or the next run finds the
			// interpreter still busy and is killed for it.
			_ = p.cmd.Process.Signal(syscall.SIGINT)
			graceC = time.After(it.cfg.DefaultGrace)
		case <-graceC:
			p.setEnd(protocol.ErrorInterpreterKilled, fmt.Sprintf("%s did not answer within %s nor after SIGINT", method, timeout))
			go p.kill()
			graceC, killC = nil, time.After(killWait)
		case <-killC:
			return nil, fmt.Errorf("%s: the interpreter did not go when killed; a fresh one takes its place: the state is lost", method)
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
