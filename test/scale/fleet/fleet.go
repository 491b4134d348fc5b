// Package fleet stands in for the agents of simulated sandbox pods. kwok
// plays the kubelet of thousands of pods that run no process, so nothing
// would answer the manager at a pod's IP; the fleet watches the sandbox pods
// and, as soon as kwok gives one an IP, listens on that IP (the scale runs
// hand kwok a loopback range) and the agent port, and answers the agent's
// HTTP API (pkg/protocol) there for that pod alone. The manager dials pods as
// it does in a cluster: pod IP and agent port, a token signed for the pod.
//
// What is simulated: no Python runs. A run's code is read line by line:
// print('text') writes text and a newline to stdout, sleep(SECONDS) waits
// (an interrupt or the timeout cuts it), raise fails the run, and a last line
// that is an integer is the run's result; anything else is taken as done. The
// run-ID semantics are the agent's (the same ID attaches or returns the
// stored result, never runs twice), and so are tokens (verified with the
// pod's --trusted-keys for its UID), interpreter tags (a reset makes a new
// one, a run naming an old one is refused) and the readiness report. Files,
// variables, shell, snapshots and bridge calls answer 501.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Fleet serves one stand-in agent per pod it was given.
type Fleet struct {
	// Port is the agent port (the manager's --agent-port).
	Port int

	mu     sync.Mutex
	agents map[types.UID]*Agent
	// Requests counts the calls answered, by API path pattern.
	requests sync.Map // string -> *atomic.Int64
	errs     atomic.Int64
}

// New returns an empty fleet answering on port.
func New(port int) *Fleet { return &Fleet{Port: port, agents: map[types.UID]*Agent{}} }

// Sync starts the agent of a pod that has an IP and stops that of a pod that
// is gone. Call it with every pod event (deleted: the pod is gone).
func (f *Fleet) Sync(pod *corev1.Pod, deleted bool) error {
	f.mu.Lock()
	a := f.agents[pod.UID]
	if deleted {
		delete(f.agents, pod.UID)
		f.mu.Unlock()
		if a != nil {
			a.stop()
		}
		return nil
	}
	if a != nil && pod.Status.PodIP != "" && a.ip != pod.Status.PodIP {
		// kwok can give a pod a second IP when its stages run behind (a
		// kubelet never does): the agent moves there, its state with it.
		err := a.rebind(pod.Status.PodIP, f.Port)
		f.mu.Unlock()
		if err != nil {
			f.errs.Add(1)
			return fmt.Errorf("agent of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return nil
	}
	if a != nil || pod.Status.PodIP == "" {
		f.mu.Unlock()
		return nil
	}
	a, err := f.newAgent(pod)
	if err == nil {
		f.agents[pod.UID] = a
	}
	f.mu.Unlock()
	if err != nil {
		f.errs.Add(1)
		return fmt.Errorf("agent of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// Len is how many agents answer now.
func (f *Fleet) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.agents)
}

// Requests returns the calls answered so far by API path pattern.
func (f *Fleet) Requests() map[string]int64 {
	out := map[string]int64{}
	f.requests.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// Errors counts pods the fleet could not serve (no trusted key, a listen failure).
func (f *Fleet) Errors() int64 { return f.errs.Load() }

// Stop stops every agent.
func (f *Fleet) Stop() {
	f.mu.Lock()
	agents := f.agents
	f.agents = map[types.UID]*Agent{}
	f.mu.Unlock()
	for _, a := range agents {
		a.stop()
	}
}

func (f *Fleet) count(pattern string) {
	v, _ := f.requests.LoadOrStore(pattern, &atomic.Int64{})
	v.(*atomic.Int64).Add(1)
}

// trustedKeys is the pod's agent --trusted-keys flag, as the agent reads it.
func trustedKeys(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		for i, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--trusted-keys="); ok {
				return v
			}
			if a == "--trusted-keys" && i+1 < len(c.Args) {
				return c.Args[i+1]
			}
		}
	}
	return ""
}

func (f *Fleet) newAgent(pod *corev1.Pod) (*Agent, error) {
	v, err := agentauth.NewVerifier(trustedKeys(pod), string(pod.UID))
	if err != nil {
		return nil, err
	}
	a := &Agent{verify: v.Verify, interp: newTag(), runs: map[string]*run{}}
	a.handle = a.handler(f.count)
	if err := a.rebind(pod.Status.PodIP, f.Port); err != nil {
		return nil, err
	}
	return a, nil
}

// rebind serves the agent at ip (and no longer where it served before).
func (a *Agent) rebind(ip string, port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	if a.srv != nil {
		_ = a.srv.Close()
	}
	a.ip = ip
	a.srv = &http.Server{Handler: a.handle, ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(ln) }(a.srv)
	return nil
}

// Agent answers the agent API of one pod.
type Agent struct {
	verify func(string) error
	handle http.Handler
	// ip and srv are where it serves; the fleet's lock guards them.
	ip  string
	srv *http.Server

	mu       sync.Mutex
	interp   string
	runs     map[string]*run
	order    []string // run IDs, oldest first, to forget the oldest
	busy     int
	runCount int64
	last     *time.Time
}

// keepRuns is how many finished runs are remembered by ID (the agent's default).
const keepRuns = 256

type run struct {
	done   chan struct{}
	cancel context.CancelCauseFunc
	result *protocol.Result
}

var errInterrupted = errors.New("interrupted")

func newTag() string { return uuid.NewString()[:8] }

func (a *Agent) stop() {
	_ = a.srv.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.runs {
		if r.cancel != nil {
			r.cancel(errInterrupted)
		}
	}
}

func (a *Agent) handler(count func(string)) http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, auth bool, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			count(pattern)
			if auth {
				tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				if !ok || a.verify(tok) != nil {
					writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
					return
				}
			}
			h(w, r)
		})
	}
	handle("GET "+protocol.PathHealthz, false, a.health)
	handle("GET "+protocol.PathReadyz, false, a.health)
	handle("POST "+protocol.PathExecute, true, a.execute)
	handle("GET "+protocol.PathExecution, true, a.execution)
	handle("POST "+protocol.PathInterrupt, true, a.interrupt)
	handle("POST "+protocol.PathReset, true, a.reset)
	handle("/", true, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, "the scale test's stand-in agent does not simulate "+r.URL.Path)
	})
	return mux
}

func (a *Agent) health(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	h := protocol.Health{OK: true, Python: "stand-in", Workers: 1, Busy: a.busy, Interpreter: a.interp, Runs: a.runCount, LastActivity: a.last,
		Protocol: protocol.Version, Agent: "scale-fleet"}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, h)
}

func (a *Agent) execute(w http.ResponseWriter, r *http.Request) {
	var req protocol.ExecuteRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "decode the request: "+err.Error())
		return
	}
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	stream := req.Stream || r.Header.Get("Accept") == protocol.ContentTypeNDJSON
	a.mu.Lock()
	ru, attach := a.runs[req.ID]
	if !attach {
		if a.busy > 0 {
			a.mu.Unlock()
			writeError(w, http.StatusConflict, "another execution is running")
			return
		}
		ru = a.start(req)
	}
	a.mu.Unlock()
	select {
	case <-ru.done:
	case <-r.Context().Done():
		// As the agent: a caller that goes away does not stop the code, and
		// can attach again by ID.
		return
	}
	if !stream {
		writeJSON(w, http.StatusOK, ru.result)
		return
	}
	w.Header().Set("Content-Type", protocol.ContentTypeNDJSON)
	enc := json.NewEncoder(w)
	if ru.result.Stdout != "" {
		_ = enc.Encode(protocol.Event{Type: protocol.EventStdout, Data: ru.result.Stdout})
	}
	_ = enc.Encode(protocol.Event{Type: protocol.EventResult, Result: ru.result})
}

// start begins a run; a.mu is held.
func (a *Agent) start(req protocol.ExecuteRequest) *run {
	now := time.Now()
	ru := &run{done: make(chan struct{})}
	a.runs[req.ID] = ru
	a.order = append(a.order, req.ID)
	if len(a.order) > keepRuns {
		delete(a.runs, a.order[0])
		a.order = a.order[1:]
	}
	res := &protocol.Result{ID: req.ID, Status: protocol.StatusSucceeded, Interpreter: a.interp, StartedAt: now, Resumed: req.Resumed}
	if req.Interpreter != "" && req.Interpreter != a.interp {
		res.Status = protocol.StatusFailed
		res.Error = &protocol.Error{Type: protocol.ErrorInterpreterRestarted,
			Message: "the session's interpreter " + req.Interpreter + " was replaced: its state is gone"}
		ru.result = res.Finish(now)
		close(ru.done)
		return ru
	}
	a.busy++
	a.runCount++
	a.last = &now
	ctx, cancel := context.WithCancelCause(context.Background())
	ctx, stop := context.WithTimeoutCause(ctx, protocol.Millis(req.TimeoutMillis, protocol.DefaultTimeout), context.DeadlineExceeded)
	ru.cancel = cancel
	go func() {
		defer stop()
		interpret(ctx, req.Code, res)
		end := time.Now()
		a.mu.Lock()
		a.busy--
		a.last = &end
		ru.result = res.Finish(end)
		a.mu.Unlock()
		close(ru.done)
	}()
	return ru
}

// interpret plays the code (see the package comment) into res.
func interpret(ctx context.Context, code string, res *protocol.Result) {
	var stdout strings.Builder
	lines := strings.Split(strings.TrimSpace(code), "\n")
	for i, line := range lines {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "print(") && strings.HasSuffix(line, ")"):
			stdout.WriteString(strings.Trim(line[len("print("):len(line)-1], `'"`) + "\n")
		case strings.HasPrefix(line, "sleep(") && strings.HasSuffix(line, ")"):
			secs, _ := strconv.ParseFloat(line[len("sleep("):len(line)-1], 64)
			select {
			case <-ctx.Done():
				res.Stdout = stdout.String()
				res.Status = protocol.StatusInterrupted
				if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
					res.Status = protocol.StatusTimedOut
				}
				res.Error = &protocol.Error{Type: "KeyboardInterrupt", Message: "interrupted"}
				return
			case <-time.After(time.Duration(secs * float64(time.Second))):
			}
		case line == "raise":
			res.Stdout = stdout.String()
			res.Status = protocol.StatusFailed
			res.Error = &protocol.Error{Type: "RuntimeError", Message: "raised"}
			return
		case i == len(lines)-1:
			if _, err := strconv.ParseInt(line, 10, 64); err == nil {
				v := line
				res.Result = &v
			}
		}
	}
	res.Stdout = stdout.String()
}

func (a *Agent) execution(w http.ResponseWriter, r *http.Request) { a.report(w, r, false) }

func (a *Agent) interrupt(w http.ResponseWriter, r *http.Request) { a.report(w, r, true) }

// report answers what became of a run by its ID, interrupting it first if
// asked and it still runs (202 then, as the agent answers).
func (a *Agent) report(w http.ResponseWriter, r *http.Request, interrupt bool) {
	id := r.PathValue("id")
	a.mu.Lock()
	ru, ok := a.runs[id]
	a.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "no execution "+id)
		return
	}
	select {
	case <-ru.done:
		writeJSON(w, http.StatusOK, protocol.ExecutionInfo{ID: id, Result: ru.result})
	default:
		code := http.StatusOK
		if interrupt {
			ru.cancel(errInterrupted)
			code = http.StatusAccepted
		}
		writeJSON(w, code, protocol.ExecutionInfo{ID: id, Running: true})
	}
}

// reset replaces the interpreter: a new tag, as a new process has.
func (a *Agent) reset(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.busy > 0 {
		writeError(w, http.StatusConflict, "an execution is running")
		return
	}
	a.interp = newTag()
	writeJSON(w, http.StatusOK, map[string]bool{"reset": true})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, protocol.ErrorBody{Error: msg})
}
