// Package server serves the agent's HTTP API (/v1) over one or more
// interpreters: execute (blocking or NDJSON stream), interrupt, bridge answers,
// variables, reset, workspace files, shell, health and readiness.
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/warmpool/warmpool/internal/agent/handover"
	"github.com/warmpool/warmpool/internal/agent/interpreter"
	"github.com/warmpool/warmpool/internal/agent/shell"
	"github.com/warmpool/warmpool/internal/agent/workspace"
	"github.com/warmpool/warmpool/internal/version"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Config of a Server.
type Config struct {
	// Token every request but health and readiness must carry as a bearer token.
	// Empty, with no Verify, turns authentication off (only for a Unix socket
	// only its owner can open).
	Token string
	// Verify, when set, checks bearer tokens instead of Token: in a pod, tokens
	// the manager signed for this pod alone (internal/agentauth).
	Verify func(token string) error
	// Workers are the interpreters; requests go to a free one.
	Workers   []*interpreter.Interpreter
	Workspace *workspace.Workspace
	// ScratchDirs are emptied, with the workspace, by a reset with
	// protocol.QueryWipe (in a pod: /tmp).
	ScratchDirs []string
	// Sandbox: the agent is PID 1 of the sandbox and alone in it but for the
	// code, so a hand-over (a reset with protocol.QueryWipe) also ends every
	// other process and empties shared memory and IPC (internal/agent/handover).
	Sandbox bool
	// KeepResults is how many finished executions are remembered by ID.
	KeepResults    int
	DefaultTimeout time.Duration
	DefaultGrace   time.Duration
	MaxOutputBytes int
	// MaxTimeout bounds a request's timeout.
	MaxTimeout time.Duration
	// MaxRequestBytes bounds request bodies (code, context) other than file writes.
	MaxRequestBytes int64
	// MaxFileBytes bounds a file write.
	MaxFileBytes int64
	// MaxSnapshotBytes bounds a snapshot made or restored (namespace and
	// workspace); SnapshotDir holds their files meanwhile (default: the
	// system's temporary directory).
	MaxSnapshotBytes int64
	SnapshotDir      string
	// Isolation, when set, holds readiness until the pool's NetworkPolicy is
	// enforced (internal/agent/isolation).
	Isolation interface {
		Enforced() bool
		Addr() string
	}
	Log logr.Logger
}

// Sessions and workers (daemon mode, --workers N): a session is bound to one
// interpreter from its first execution until it is reset, and an interpreter
// serves at most one session, so two sessions never see each other's state.
// Runs without a session go to interpreters no session is bound to; a session
// that binds an interpreter on which such runs left state gets it reset first.
// When every interpreter is bound, a new session (or a run without one) is
// refused with 409 rather than put on another session's interpreter; queueing
// would not help, since a binding lasts until the session is reset.
// (In a pod there is one worker and no sessions: every run goes to it.)
type worker struct {
	interp *interpreter.Interpreter
	busy   bool
	// snapshotting: busy with a snapshot that does not seal (a checkpoint):
	// a run waits for it rather than be refused.
	snapshotting bool
	session      string // the session bound to it; "" for none
	dirty        bool   // runs without a session left state in it
}

// Server is the agent's HTTP API.
type Server struct {
	cfg      Config
	reg      *registry
	mu       sync.Mutex
	workers  []*worker
	sessions map[string]int // session -> worker index
	// runs and lastActivity (Unix nanoseconds) are reported by /readyz.
	runs, lastActivity atomic.Int64
	// shells counts the shell commands running (POST /v1/shell), which hold
	// no worker: /readyz counts them busy, so a Session's idle timeout does
	// not pass under a long command.
	shells atomic.Int64
	// writes counts file writes under way; sealed (under mu) refuses runs,
	// shell commands, file writes and restores after a sealing snapshot.
	writes atomic.Int64
	sealed bool
	// moved (under mu) is the move the last restore asked the next run to say.
	moved *protocol.Moved
	// changed (under mu) is closed, and replaced, when a worker is released
	// or a shell command or file write ends: what waits for quiet wakes.
	changed chan struct{}
}

// apiError is an error with the HTTP status it is answered with.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func errorCode(err error, def int) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	return def
}

// New returns a Server; call Handler to serve it.
func New(cfg Config) *Server {
	if cfg.KeepResults == 0 {
		cfg.KeepResults = 256
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = protocol.DefaultTimeout
	}
	if cfg.DefaultGrace == 0 {
		cfg.DefaultGrace = protocol.DefaultGrace
	}
	if cfg.MaxOutputBytes == 0 {
		cfg.MaxOutputBytes = 64 * 1024
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = 4 << 20
	}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = 64 << 20
	}
	if cfg.MaxSnapshotBytes == 0 {
		cfg.MaxSnapshotBytes = 512 << 20
	}
	s := &Server{cfg: cfg, reg: newRegistry(cfg.KeepResults), sessions: map[string]int{}, changed: make(chan struct{})}
	for _, it := range cfg.Workers {
		s.workers = append(s.workers, &worker{interp: it})
	}
	return s
}

// Handler returns the HTTP handler of the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+protocol.PathHealthz, s.healthz)
	mux.HandleFunc("GET "+protocol.PathReadyz, s.readyz)
	// A request is the Session's activity (its idle timeout counts from the
	// last one) unless passive says it is the manager's own look: a
	// checkpoint, a wait for quiet.
	authAs := func(h http.HandlerFunc, passive func(*http.Request) bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if s.cfg.Token != "" || s.cfg.Verify != nil {
				got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				if ok && s.cfg.Verify != nil {
					ok = s.cfg.Verify(got) == nil
				} else if ok {
					ok = subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1
				}
				if !ok {
					w.Header().Set("WWW-Authenticate", `Bearer realm="warmpool-agent"`)
					writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
					return
				}
			}
			if passive != nil && passive(r) {
				h(w, r)
				return
			}
			s.lastActivity.Store(time.Now().UnixNano())
			h(w, r)
			s.lastActivity.Store(time.Now().UnixNano())
		}
	}
	auth := func(h http.HandlerFunc) http.HandlerFunc { return authAs(h, nil) }
	always := func(*http.Request) bool { return true }
	checkpoint := func(r *http.Request) bool { return r.URL.Query().Get(protocol.QueryCheckpoint) == "true" }
	mux.HandleFunc("POST "+protocol.PathExecute, auth(s.execute))
	mux.HandleFunc("GET "+protocol.PathExecution, auth(s.getExecution))
	mux.HandleFunc("POST "+protocol.PathInterrupt, auth(s.interrupt))
	mux.HandleFunc("POST "+protocol.PathBridge, auth(s.answerBridge))
	mux.HandleFunc("GET "+protocol.PathVariable, auth(s.variable))
	mux.HandleFunc("POST "+protocol.PathReset, auth(s.reset))
	mux.HandleFunc("POST "+protocol.PathShell, auth(s.shell))
	mux.HandleFunc("GET "+protocol.PathFileRead, auth(s.fileRead))
	mux.HandleFunc("PUT "+protocol.PathFileWrite, auth(s.fileWrite))
	mux.HandleFunc("GET "+protocol.PathFileList, auth(s.fileList))
	mux.HandleFunc("GET "+protocol.PathFileStat, auth(s.fileStat))
	mux.HandleFunc("POST "+protocol.PathSnapshot, authAs(s.snapshot, checkpoint))
	mux.HandleFunc("GET "+protocol.PathQuiet, authAs(s.quiet, always))
	mux.HandleFunc("POST "+protocol.PathRestore, auth(s.restore))
	mux.HandleFunc("POST "+protocol.PathUnseal, auth(s.unseal))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, protocol.ErrorBody{Error: msg})
}

// decode reads a JSON body strictly: unknown fields and trailing data are errors.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxRequestBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "invalid JSON body: more than one JSON value")
		return false
	}
	return true
}

// boundSessions lists the sessions bound to workers, for messages.
func (s *Server) boundSessions() string {
	names := make([]string, 0, len(s.sessions))
	for name := range s.sessions {
		names = append(names, strconv.Quote(name))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// acquire reserves a free worker for a run: the session's own when it has one,
// else one no session is bound to (see worker). reset says the worker must get
// a fresh interpreter before the run.
func (s *Server) acquire(session string, python bool) (wk *worker, reset bool, err error) {
	deadline := time.Now().Add(holdWait)
	for {
		wk, reset, changed, err := s.tryAcquire(session, python)
		if !errors.Is(err, errSnapshotting) {
			return wk, reset, err
		}
		// A checkpoint holds the interpreter for as long as it pickles: the
		// run waits for it, never refused because of the manager's own work.
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			return nil, false, &apiError{http.StatusConflict, "a snapshot of the session's state has held the interpreter for " +
				holdWait.String() + "; retry once it ends"}
		}
	}
}

// errSnapshotting: the worker a run needs is held by a checkpoint.
var errSnapshotting = errors.New("held by a snapshot")

func (s *Server) tryAcquire(session string, python bool) (wk *worker, reset bool, changed <-chan struct{}, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wk, reset, err = s.acquireLocked(session, python)
	return wk, reset, s.changed, err
}

func (s *Server) acquireLocked(session string, python bool) (wk *worker, reset bool, err error) {
	if s.sealed {
		return nil, false, errSealed
	}
	if i, ok := s.sessions[session]; ok && session != "" {
		if s.workers[i].snapshotting {
			return nil, false, errSnapshotting
		}
		if s.workers[i].busy {
			return nil, false, &apiError{http.StatusConflict, fmt.Sprintf(
				"session %q is busy with another execution; executions of one session run one at a time", session)}
		}
		s.workers[i].busy = true
		return s.workers[i], false, nil
	}
	var free *worker
	unbound := 0
	for _, w := range s.workers {
		if w.session != "" {
			continue
		}
		unbound++
		// A new session prefers an interpreter without state.
		if !w.busy && (free == nil || (session != "" && free.dirty && !w.dirty)) {
			free = w
		}
	}
	switch {
	case unbound == 0 && session != "":
		return nil, false, &apiError{http.StatusConflict, fmt.Sprintf(
			"all %d interpreters are bound to other sessions (%s); reset one of them (POST %s?session=NAME) to free its interpreter, "+
				"or start the agent with more --workers", len(s.workers), s.boundSessions(), protocol.PathReset)}
	case unbound == 0:
		return nil, false, &apiError{http.StatusConflict, fmt.Sprintf(
			"all %d interpreters are bound to sessions (%s), and a run without a session must not share their state: "+
				"pass a session, or reset one of them (POST %s?session=NAME)", len(s.workers), s.boundSessions(), protocol.PathReset)}
	case free == nil && len(s.workers) == 1 && s.workers[0].snapshotting:
		return nil, false, errSnapshotting
	case free == nil && len(s.workers) == 1:
		return nil, false, &apiError{http.StatusConflict, "an execution is already running; one runs at a time: wait for it or interrupt it"}
	case free == nil:
		return nil, false, &apiError{http.StatusConflict, fmt.Sprintf(
			"all %d interpreters not bound to other sessions are busy; retry later or interrupt one", unbound)}
	}
	free.busy = true
	if session != "" {
		for i, w := range s.workers {
			if w == free {
				s.sessions[session] = i
			}
		}
		free.session = session
		reset, free.dirty = free.dirty, false
	} else if python {
		free.dirty = true
	}
	return free, reset, nil
}

func (s *Server) release(w *worker) {
	s.mu.Lock()
	w.busy, w.snapshotting = false, false
	s.notifyLocked()
	s.mu.Unlock()
}

// notifyLocked wakes what waits for a change of busy workers, shell commands
// or file writes.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// ended counts one shell command or file write (n) done, and wakes waiters.
func (s *Server) ended(n *atomic.Int64) {
	n.Add(-1)
	s.mu.Lock()
	s.notifyLocked()
	s.mu.Unlock()
}

// quiet answers once more than ?after runs were started and nothing runs,
// or after ?waitMillis (at most protocol.MaxQuietWait): a durable Session's
// checkpointer waits here for a run to end, without asking again and again.
func (s *Server) quiet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, err := strconv.ParseInt(q.Get(protocol.QueryAfter), 10, 64)
	if err != nil || after < 0 {
		writeError(w, http.StatusBadRequest, protocol.QueryAfter+" must be a number of runs, 0 or more")
		return
	}
	wait, err := strconv.ParseInt(q.Get(protocol.QueryWaitMillis), 10, 64)
	if err != nil || wait < 0 || time.Duration(wait)*time.Millisecond > protocol.MaxQuietWait {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be 0-%d", protocol.QueryWaitMillis, protocol.MaxQuietWait.Milliseconds()))
		return
	}
	timer := time.NewTimer(time.Duration(wait) * time.Millisecond)
	defer timer.Stop()
	for {
		s.mu.Lock()
		runs, changed := s.runs.Load(), s.changed
		idle := s.shells.Load() == 0 && s.writes.Load() == 0
		for _, wk := range s.workers {
			idle = idle && !wk.busy
		}
		s.mu.Unlock()
		if runs > after && idle {
			writeJSON(w, http.StatusOK, protocol.Quiet{Runs: runs, Quiet: true})
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			writeJSON(w, http.StatusOK, protocol.Quiet{Runs: runs})
			return
		case <-r.Context().Done():
			return
		}
	}
}

// sessionWorker is the worker of a session; for "", the first worker no
// session is bound to (in a pod, the only one).
func (s *Server) sessionWorker(session string) (*worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if session != "" {
		if i, ok := s.sessions[session]; ok {
			return s.workers[i], nil
		}
		return nil, &apiError{http.StatusNotFound, fmt.Sprintf("no session %q: it has not run anything since the agent started or it was reset", session)}
	}
	for _, w := range s.workers {
		if w.session == "" {
			return w, nil
		}
	}
	return nil, &apiError{http.StatusConflict, fmt.Sprintf(
		"all %d interpreters are bound to sessions (%s): name one with ?session=", len(s.workers), s.boundSessions())}
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func (s *Server) validate(req *protocol.ExecuteRequest) error {
	if req.ID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		req.ID = hex.EncodeToString(b)
	}
	switch {
	case !idPattern.MatchString(req.ID):
		return errors.New("id must be 1-128 letters, digits, '.', '_', ':' or '-'")
	case strings.TrimSpace(req.Code) == "":
		return errors.New("code is required")
	case req.Language != "" && req.Language != protocol.LanguagePython && req.Language != protocol.LanguageShell:
		return fmt.Errorf("language %q is not supported: use python or shell", req.Language)
	case req.TimeoutMillis < 0 || req.GraceMillis < 0 || req.MaxOutputBytes < 0 || req.MaxBridgeCalls < 0:
		return errors.New("timeoutMillis, graceMillis, maxOutputBytes and maxBridgeCalls must not be negative")
	case time.Duration(req.TimeoutMillis)*time.Millisecond > s.cfg.MaxTimeout:
		return fmt.Errorf("timeoutMillis is above the maximum of %s", s.cfg.MaxTimeout)
	case req.MaxOutputBytes > s.cfg.MaxOutputBytes:
		return fmt.Errorf("maxOutputBytes is above this agent's maximum of %d", s.cfg.MaxOutputBytes)
	case len(req.Context) > 0 && !json.Valid(req.Context):
		return errors.New("context is not valid JSON")
	case len(req.BridgeMethods) > 0 && !req.Bridge:
		return errors.New("bridgeMethods needs bridge: the caller answers them as bridge calls")
	}
	for _, m := range req.BridgeMethods {
		if !slices.Contains(protocol.MemoryMethods, m) {
			return fmt.Errorf("bridgeMethods: %q is not a memory function (%s)", m, strings.Join(protocol.MemoryMethods, ", "))
		}
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("env name %q is not valid", k)
		}
	}
	return nil
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req protocol.ExecuteRequest
	if !s.decode(w, r, &req) {
		return
	}
	if err := s.validate(&req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	stream := req.Stream || strings.Contains(r.Header.Get("Accept"), protocol.ContentTypeNDJSON)
	if req.Bridge && !stream {
		writeError(w, http.StatusBadRequest, "bridge needs a streaming execute: bridge calls are sent as events")
		return
	}
	e, created := s.reg.getOrCreate(req.ID)
	if created {
		wk, reset, err := s.acquire(req.Session, req.Language != protocol.LanguageShell)
		if errors.Is(err, errSealed) {
			s.reg.forget(req.ID)
			writeSealed(w)
			return
		}
		if err != nil {
			s.reg.forget(req.ID)
			writeError(w, errorCode(err, http.StatusConflict), err.Error())
			return
		}
		s.start(e, wk, req, stream, reset, s.runs.Add(1))
	} else {
		s.cfg.Log.V(1).Info("attaching to execution", "id", req.ID)
	}
	if !stream {
		select {
		case <-e.done:
			writeJSON(w, http.StatusOK, e.result)
		case <-r.Context().Done():
		}
		return
	}
	s.streamEvents(w, r, e, created)
}

// start runs the execution on the worker, independent of the HTTP request: a
// caller that goes away does not stop the code, and can attach again by ID.
func (s *Server) start(e *execution, wk *worker, req protocol.ExecuteRequest, stream bool, reset bool, run int64) {
	onOut := func(kind string) func([]byte) {
		if !stream {
			return nil
		}
		return func(b []byte) { e.emit(protocol.Event{Type: kind, Data: string(b)}) }
	}
	if req.Language == protocol.LanguageShell {
		ctx, cancel := context.WithCancel(context.Background())
		e.setInterrupt(func() bool { cancel(); return true })
		go func() {
			defer cancel()
			before := s.cfg.Workspace.Snapshot()
			res := s.runShell(ctx, req, onOut(protocol.EventStdout), onOut(protocol.EventStderr))
			res.Files = workspace.Changes(before, s.cfg.Workspace.Snapshot())
			res.Resumed, res.Moved, res.Run = req.Resumed, s.takeMoved(), run
			// Free the worker before anyone sees the result, so the caller's next request finds it free.
			s.release(wk)
			s.reg.finish(e, res)
		}()
		return
	}
	e.setInterrupt(wk.interp.Interrupt)
	hooks := interpreter.Hooks{OnStdout: onOut(protocol.EventStdout), OnStderr: onOut(protocol.EventStderr)}
	hooks.Interrupted = e.interruptAsked.Load
	if stream {
		hooks.OnDisplay = func(d protocol.Display) { e.emit(protocol.Event{Type: protocol.EventDisplay, Display: &d}) }
	}
	if req.Bridge {
		hooks.OnBridge = func(call protocol.BridgeCall, done <-chan struct{}) (json.RawMessage, error) {
			ch := make(chan protocol.BridgeAnswer, 1)
			e.mu.Lock()
			e.bridges[call.ID] = ch
			e.mu.Unlock()
			e.emit(protocol.Event{Type: protocol.EventBridge, Call: &call})
			select {
			case a := <-ch:
				if a.Error != "" {
					return nil, errors.New(a.Error)
				}
				return a.Result, nil
			case <-done:
				return nil, errors.New("execution ended")
			}
		}
	}
	if req.TimeoutMillis == 0 {
		req.TimeoutMillis = s.cfg.DefaultTimeout.Milliseconds()
	}
	go func() {
		var res *protocol.Result
		var err error
		if reset { // a new session on an interpreter that runs without a session used
			err = wk.interp.Reset()
		}
		if err == nil {
			before := s.cfg.Workspace.Snapshot()
			res, err = wk.interp.Execute(req, hooks)
			if err == nil {
				res.Files = workspace.Changes(before, s.cfg.Workspace.Snapshot())
			}
		}
		s.release(wk) // before the result is visible: see the shell case
		if err != nil {
			res = &protocol.Result{ID: req.ID, Status: protocol.StatusFailed, StartedAt: time.Now(), FinishedAt: time.Now(),
				Error: &protocol.Error{Type: "AgentError", Message: err.Error()}}
		}
		res.Resumed, res.Moved, res.Run = req.Resumed, s.takeMoved(), run
		s.reg.finish(e, res)
	}()
}

// takeMoved returns the move a restore asked to be said, once.
func (s *Server) takeMoved() *protocol.Moved {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.moved
	s.moved = nil
	return m
}

func (s *Server) runShell(ctx context.Context, req protocol.ExecuteRequest, onOut, onErr func([]byte)) *protocol.Result {
	started := time.Now()
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = s.cfg.MaxOutputBytes
	}
	sr, err := shell.Run(ctx, req.Code, shell.Options{
		Dir: s.cfg.Workspace.Dir(), Env: shell.Env(req.Env),
		Timeout: protocol.Millis(req.TimeoutMillis, s.cfg.DefaultTimeout), Grace: protocol.Millis(req.GraceMillis, s.cfg.DefaultGrace),
		MaxOutputBytes: limit, OnStdout: onOut, OnStderr: onErr,
	})
	res := &protocol.Result{ID: req.ID, StartedAt: started}
	switch {
	case err != nil:
		res.Status = protocol.StatusFailed
		res.Error = &protocol.Error{Type: "ShellError", Message: err.Error()}
	default:
		res.Stdout, res.Stderr = sr.Stdout, sr.Stderr
		res.StdoutTruncated, res.StderrTruncated = sr.StdoutTruncated, sr.StderrTruncated
		code := sr.ExitCode
		res.ExitCode = &code
		switch {
		case sr.TimedOut:
			res.Status = protocol.StatusTimedOut
		case ctx.Err() != nil:
			res.Status = protocol.StatusInterrupted
		case code == 0:
			res.Status = protocol.StatusSucceeded
		default:
			res.Status = protocol.StatusFailed
			res.Error = &protocol.Error{Type: "NonZeroExit", Message: fmt.Sprintf("the command exited with code %d", code)}
		}
	}
	return res.Finish(time.Now())
}

func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, e *execution, owner bool) {
	w.Header().Set("Content-Type", protocol.ContentTypeNDJSON)
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(evs []protocol.Event) bool {
		for i := range evs {
			if err := enc.Encode(&evs[i]); err != nil {
				return false
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	var flushed time.Time
	for {
		var evs []protocol.Event
		if owner { // only the caller that started it gets the live events
			evs = e.take()
		}
		select {
		case <-e.done:
			if owner {
				evs = append(evs, e.take()...)
			}
			send(append(evs, protocol.Event{Type: protocol.EventResult, Result: e.result}))
			return
		default:
		}
		if len(evs) > 0 {
			if !send(evs) {
				return
			}
			flushed = time.Now()
		}
		select {
		case <-e.notify:
		case <-e.done:
			continue
		case <-r.Context().Done():
			return
		}
		// A flood of small writes would otherwise cost an encode and a flush
		// each (measured under gVisor: 0.5 ms per print, most of it here);
		// the first event after a quiet spell goes out at once.
		if wait := streamFlushInterval - time.Since(flushed); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-e.done:
			case <-r.Context().Done():
				t.Stop()
				return
			}
			t.Stop()
		}
	}
}

// streamFlushInterval is the least time between two flushes of a stream of
// events.
const streamFlushInterval = 20 * time.Millisecond

func (s *Server) getExecution(w http.ResponseWriter, r *http.Request) {
	e := s.reg.get(r.PathValue("id"))
	if e == nil {
		writeError(w, http.StatusNotFound, "no execution with this id (unknown, or its result was evicted)")
		return
	}
	select {
	case <-e.done:
		writeJSON(w, http.StatusOK, protocol.ExecutionInfo{ID: e.id, Result: e.result})
	default:
		writeJSON(w, http.StatusOK, protocol.ExecutionInfo{ID: e.id, Running: true})
	}
}

func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) {
	e := s.reg.get(r.PathValue("id"))
	if e == nil {
		writeError(w, http.StatusNotFound, "no execution with this id")
		return
	}
	select {
	case <-e.done:
		writeJSON(w, http.StatusOK, protocol.ExecutionInfo{ID: e.id, Result: e.result})
		return
	default:
	}
	e.doInterrupt()
	writeJSON(w, http.StatusAccepted, protocol.ExecutionInfo{ID: e.id, Running: true})
}

func (s *Server) answerBridge(w http.ResponseWriter, r *http.Request) {
	e := s.reg.get(r.PathValue("id"))
	if e == nil {
		writeError(w, http.StatusNotFound, "no execution with this id")
		return
	}
	var a protocol.BridgeAnswer
	if !s.decode(w, r, &a) {
		return
	}
	e.mu.Lock()
	ch, ok := e.bridges[r.PathValue("call")]
	delete(e.bridges, r.PathValue("call"))
	e.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "no pending bridge call with this id (already answered, or the execution ended)")
		return
	}
	ch <- a
	writeJSON(w, http.StatusOK, map[string]bool{"delivered": true})
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (s *Server) variable(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !identifier.MatchString(name) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is not a Python identifier", name))
		return
	}
	wk, err := s.sessionWorker(r.URL.Query().Get("session"))
	if err != nil {
		writeError(w, errorCode(err, http.StatusBadRequest), err.Error())
		return
	}
	v, found, err := wk.interp.Variable(name)
	var tooLarge *interpreter.VariableTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.Is(err, interpreter.ErrBusy):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case !found:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no variable %q in the interpreter", name))
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

// reset gives the session (or the runs without one) a fresh interpreter; a
// session's interpreter is then free for any session.
func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	session := r.URL.Query().Get("session")
	wk, err := s.sessionWorker(session)
	if err != nil {
		writeError(w, errorCode(err, http.StatusBadRequest), err.Error())
		return
	}
	var sweepErr error
	if r.URL.Query().Get(protocol.QueryWipe) == "true" {
		// The sandbox passes to another user: with the interpreter and every
		// process it started gone, nothing writes while it is emptied, and
		// what is left is named (the manager then deletes the pod).
		err = wk.interp.ResetWith(func() { sweepErr = s.handOver().Sweep() })
		if err == nil && sweepErr != nil {
			s.cfg.Log.Info("hand-over left something of the last user; the sandbox must not be reused", "err", sweepErr.Error())
			writeError(w, http.StatusInternalServerError, "the sandbox could not be emptied for the next user, "+
				"so it must not be reused: "+sweepErr.Error())
			return
		}
	} else {
		err = wk.interp.Reset()
	}
	if err == nil {
		s.mu.Lock()
		if session != "" && wk.session == session {
			delete(s.sessions, session)
			wk.session = ""
		}
		wk.dirty = false
		s.sealed = false // the state a sealing snapshot took is gone, and the pod may serve again
		s.mu.Unlock()
	}
	switch {
	case errors.Is(err, interpreter.ErrBusy):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeJSON(w, http.StatusOK, map[string]bool{"reset": true})
	}
}

// handOver is what a hand-over sweeps: every process but the agent's in a
// sandbox with one interpreter (several serve several users, whose processes
// the sweep must not touch), the workspace and the scratch directories.
func (s *Server) handOver() handover.Config {
	return handover.Config{
		Sandbox: s.cfg.Sandbox && len(s.workers) == 1,
		Dirs:    append([]string{s.cfg.Workspace.Dir()}, s.cfg.ScratchDirs...),
	}
}

func (s *Server) shell(w http.ResponseWriter, r *http.Request) {
	var req protocol.ShellRequest
	if !s.decode(w, r, &req) {
		return
	}
	if strings.TrimSpace(req.Command) == "" {
		writeError(w, http.StatusBadRequest, "command is required")
		return
	}
	if req.TimeoutMillis < 0 || req.MaxOutputBytes < 0 || req.MaxOutputBytes > s.cfg.MaxOutputBytes {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("timeoutMillis must not be negative and maxOutputBytes must be 0-%d", s.cfg.MaxOutputBytes))
		return
	}
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = s.cfg.MaxOutputBytes
	}
	s.shells.Add(1)
	defer s.ended(&s.shells)
	if s.isSealed() {
		writeSealed(w)
		return
	}
	res, err := shell.Run(r.Context(), req.Command, shell.Options{
		Dir: s.cfg.Workspace.Dir(), Env: shell.Env(req.Env), Timeout: protocol.Millis(req.TimeoutMillis, s.cfg.DefaultTimeout),
		Grace: s.cfg.DefaultGrace, MaxOutputBytes: limit,
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "run command: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) isSealed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sealed
}

// health is what every health answer says: the workers, and which build and
// contract version answers.
func (s *Server) health(ok bool) protocol.Health {
	return protocol.Health{OK: ok, Workers: len(s.workers), Protocol: protocol.Version, Agent: version.Build()}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.health(true))
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	h := s.health(true)
	if iso := s.cfg.Isolation; iso != nil && !iso.Enforced() {
		h = s.health(false)
		h.Message = "waiting for the pool's NetworkPolicy: the sandbox still reaches " + iso.Addr()
		writeJSON(w, http.StatusServiceUnavailable, h)
		return
	}
	for i, wk := range s.workers {
		info, err := wk.interp.Ready()
		if err != nil {
			h.OK = false
			h.Message = fmt.Sprintf("interpreter %d: %v", i, err)
			break
		}
		h.Python, h.Preloaded, h.Containment = info.Python, info.Preloaded, info.Containment
		if len(s.workers) == 1 {
			h.Interpreter, h.LastEnd = info.Tag, wk.interp.LastEnd()
		}
		s.mu.Lock()
		held := wk.busy // a run of either language holds its worker
		s.mu.Unlock()
		if held || wk.interp.Busy() {
			h.Busy++
		}
	}
	h.Busy += int(s.shells.Load())
	h.Sealed = s.isSealed()
	h.Runs = s.runs.Load()
	if t := s.lastActivity.Load(); t != 0 {
		last := time.Unix(0, t).UTC()
		h.LastActivity = &last
	}
	code := http.StatusOK
	if !h.OK {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, h)
}
