// Package mcpserver serves warmpool Sessions to agents over the Model Context
// Protocol: tools to run code in a stateful sandbox, read a variable, read,
// write and list files, and reset the interpreter. Each MCP client session
// gets a warmpool Session of its own, leased on its first tool call and
// closed when the MCP session ends or has made no tool call for
// Config.IdleTimeout (the Session's own idle timeout closes it if the server
// itself goes away). The code's llm_query calls are answered by the MCP
// client's model through sampling, when the client offers it.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warmpool/warmpool/internal/llm"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// Config of a Server.
type Config struct {
	// Namespace and Pool of the Sessions the server leases.
	Namespace string
	Pool      string
	// IdleTimeout closes the Session of an MCP session that has made no tool
	// call for this long, whether or not the MCP session goes on: a client
	// that left without ending it (an HTTP client that sent no DELETE) must
	// not keep a warm pod from a shared pool. The next call of an MCP session
	// that goes on is told its sandbox's state is gone; the call after that
	// leases a fresh sandbox. The Session's own idle timeout is a little
	// longer (backstopGrace), for a server that went away. 0: this server
	// closes nothing for idleness, and the pool's sessionIdleTimeout applies.
	IdleTimeout time.Duration
	// RunTimeout interrupts a run_code call that takes longer, when the call
	// does not ask for less (0: the pool's default).
	RunTimeout time.Duration
	// Credentials returns whom a tool call acts for: the server's own
	// (stdio, OwnCredentials), or the user of the HTTP request's bearer
	// token (streamable HTTP, BearerCredentials). A Session is used only by
	// calls of the Caller name that leased it.
	Credentials func(req *mcp.CallToolRequest) (*Caller, error)
	// Version is reported to clients.
	Version string
	Log     logr.Logger
}

// Server is an MCP server whose tools act on warmpool Sessions.
type Server struct {
	cfg Config
	mcp *mcp.Server

	mu       sync.Mutex
	sessions map[*mcp.ServerSession]*lease
	closed   bool // CloseAll ran: no new leases
	// closing counts the leases closeWhenDone is closing: a server that
	// exits (stdin ended, and with it the MCP session) must not cut off
	// their Sessions' deletes.
	closing sync.WaitGroup
}

// lease is the warmpool Session of one MCP session.
type lease struct {
	mu     sync.Mutex // held while the Session is created
	owner  string     // the name of the Caller that leased it
	ses    *sessions.Session
	closed bool
	// caller is the owner's latest Caller, whose credentials end the
	// Session: a token of the lease's first call may have expired by then.
	caller atomic.Pointer[Caller]

	// expired: the Session was closed for idleness while the MCP session
	// went on; the next call says so (held with mu).
	expired bool

	serial sync.Mutex // held by a run_code call (one round of it on protocol 2026-07-28)

	runMu sync.Mutex
	rt    *roundTrip // a run carried over tools/call rounds (roundtrip.go)

	idleMu   sync.Mutex
	calls    int         // tool calls under way
	lastCall time.Time   // when the last one ended
	idle     *time.Timer // armed when no call is under way; nil before the first call ends
	stopped  bool        // the lease ended: the clock is not armed again
}

// end marks the lease closed and stops a run waiting between rounds; the
// caller holds l.mu.
func (l *lease) end() {
	l.runMu.Lock()
	l.closed = true
	rt := l.rt
	l.rt = nil
	l.runMu.Unlock()
	if rt != nil {
		rt.stop()
	}
	l.idleMu.Lock()
	l.stopped = true
	if l.idle != nil {
		l.idle.Stop()
	}
	l.idleMu.Unlock()
}

// backstopGrace is how much longer than IdleTimeout a Session's own idle
// timeout is. The cluster's clock starts when a run ends in the sandbox, a
// moment before the tool call ends here: with the same timeout, a call that
// came just in time could find its Session closed under it, without being
// told why. Only a server that went away relies on the backstop.
const backstopGrace = 10 * time.Second

// maxSessionIdleTimeout is the longest idle timeout a Session accepts.
const maxSessionIdleTimeout = 24 * time.Hour

// sessionIdleTimeout is the idle timeout of the Sessions the server leases
// (0: the pool's).
func (s *Server) sessionIdleTimeout() time.Duration {
	if s.cfg.IdleTimeout <= 0 {
		return 0
	}
	return min(s.cfg.IdleTimeout+backstopGrace, maxSessionIdleTimeout)
}

// inUse makes a tool's calls count as use of their MCP session's sandbox:
// the idle clock stands while a call is under way and starts when the last
// one ends.
func inUse[In, Out any](s *Server, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		_, l, err := s.leaseFor(req)
		if err != nil {
			var none Out
			return nil, none, err
		}
		l.idleMu.Lock()
		l.calls++
		l.idleMu.Unlock()
		defer s.callEnded(l)
		return h(ctx, req, in)
	}
}

// callEnded starts the idle clock of l when no other call is under way.
func (s *Server) callEnded(l *lease) {
	l.idleMu.Lock()
	defer l.idleMu.Unlock()
	l.calls--
	l.lastCall = time.Now()
	if l.calls > 0 || l.stopped || s.cfg.IdleTimeout <= 0 {
		return
	}
	if l.idle == nil {
		l.idle = time.AfterFunc(s.cfg.IdleTimeout, func() { s.expireIdle(l) })
		return
	}
	l.idle.Reset(s.cfg.IdleTimeout)
}

// expireIdle closes the Session of an MCP session that has made no tool call
// for IdleTimeout. The MCP session itself goes on (over HTTP the SDK's
// session timeout ends it, over stdio only the host does); its next call is
// told that its state is gone rather than finding a fresh sandbox unawares.
func (s *Server) expireIdle(l *lease) {
	l.mu.Lock() // waits for a Session being leased; that call is under way, so nothing closes then
	defer l.mu.Unlock()
	if l.closed || l.ses == nil {
		return
	}
	l.runMu.Lock()
	waiting := l.rt != nil && l.rt.running()
	l.runMu.Unlock()
	l.idleMu.Lock()
	left := s.cfg.IdleTimeout - time.Since(l.lastCall)
	switch {
	case l.calls > 0 || l.stopped:
		// The last call to end arms the clock again.
	case waiting:
		// The code waits for the client's model between llm_query rounds;
		// answerTimeout bounds that wait, and the clock starts after it.
		l.idle.Reset(s.cfg.IdleTimeout)
	case left > 0:
		// A call ended as the timer fired, and its Reset came too late to stop it.
		l.idle.Reset(left)
	}
	busy := l.calls > 0 || l.stopped || waiting || left > 0
	l.idleMu.Unlock()
	if busy {
		return
	}
	ses := l.ses
	l.ses, l.expired = nil, true
	l.runMu.Lock()
	l.rt = nil // over: the check above found it ended
	l.runMu.Unlock()
	s.closeSession(l, ses, fmt.Sprintf("no tool call for %s", s.cfg.IdleTimeout))
}

// errExpired is the answer to the first call of an MCP session whose
// sandbox expireIdle closed.
func (s *Server) errExpired() error {
	return fmt.Errorf("this MCP session's sandbox was closed after %s without a tool call, and its variables, "+
		"imports and files are gone: call again to start in a fresh sandbox", s.cfg.IdleTimeout)
}

// New returns a Server with its tools registered.
func New(cfg Config) *Server {
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	s := &Server{cfg: cfg, sessions: map[*mcp.ServerSession]*lease{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "warmpool", Title: "warmpool Python sandbox", Version: cfg.Version},
		&mcp.ServerOptions{Instructions: instructions})
	s.addTools()
	return s
}

const instructions = `Tools of a stateful Python sandbox (a warmpool Session on Kubernetes, isolated by gVisor). ` +
	`Variables, imports and files persist between run_code calls of this MCP session; reset starts a fresh ` +
	`interpreter (files stay). The sandbox has no network. In the code, llm_query(prompt) asks this client's model ` +
	`(when the client supports sampling), chunk_text(text, size, overlap) splits long text, and context holds the ` +
	`value last given as run_code's context.`

// MCP returns the protocol server, to run on a transport (mcp.StdioTransport)
// or to serve with mcp.NewStreamableHTTPHandler.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// leaseFor returns the lease of the MCP session of req, made on first use,
// and the client that acts for the caller of req.
func (s *Server) leaseFor(req *mcp.CallToolRequest) (*sessions.Client, *lease, error) {
	caller, err := s.cfg.Credentials(req)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errors.New("the MCP server is shutting down")
	}
	l := s.sessions[req.Session]
	first := l == nil
	if first {
		l = &lease{owner: caller.Name}
		s.sessions[req.Session] = l
	}
	s.mu.Unlock()
	if first {
		go s.closeWhenDone(req.Session, l)
	}
	if l.owner != caller.Name {
		return nil, nil, errors.New("this MCP session's sandbox belongs to another credential: start a new MCP session")
	}
	l.caller.Store(caller)
	return caller.Sessions, l, nil
}

// session returns the warmpool Session of the MCP session of req, leasing it
// on first use, and the client that acts for the caller of req.
func (s *Server) session(ctx context.Context, req *mcp.CallToolRequest) (*sessions.Session, error) {
	c, l, err := s.leaseFor(req)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("this MCP session has ended")
	}
	if l.expired {
		l.expired = false // the next call leases a fresh sandbox
		return nil, s.errExpired()
	}
	if l.ses != nil {
		return c.Open(l.ses.Namespace, l.ses.Name), nil
	}
	// The MCP session's sandbox is bound to the credential that leased it, in
	// the cluster as here: other users of the namespace cannot use it either.
	ses, err := c.Create(ctx, s.cfg.Namespace, "mcp-", s.cfg.Pool, &sessions.Options{IdleTimeout: s.sessionIdleTimeout(), OwnerOnly: true})
	if err != nil {
		if ses != nil { // created, but it did not become Ready: do not leave it behind
			s.closeSession(l, ses, "it did not become Ready")
		}
		return nil, fmt.Errorf("lease a sandbox of pool %s/%s: %w", s.cfg.Namespace, s.cfg.Pool, err)
	}
	// Not the MCP session's ID: a credential of its own on streamable HTTP.
	s.cfg.Log.Info("leased a Session for an MCP session", "session", ses.Name, "caller", l.owner)
	l.ses = ses
	return ses, nil
}

// runFirst runs the first code of an MCP session, when it has no Session
// yet, in one request: the data plane leases the Session (kept for the next
// calls) and runs the code in it, without a wait for Ready between the two.
// ran is false when the MCP session has its Session already.
func (s *Server) runFirst(ctx context.Context, req *mcp.CallToolRequest, exec sessions.ExecRequest, h sessions.Handlers) (res *sessions.Result, ran bool, err error) {
	c, l, err := s.leaseFor(req)
	if err != nil {
		return nil, true, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, true, errors.New("this MCP session has ended")
	}
	if l.expired {
		l.expired = false // the next call leases a fresh sandbox
		return nil, true, s.errExpired()
	}
	if l.ses != nil {
		return nil, false, nil
	}
	res, ses, err := c.RunOnce(ctx, s.cfg.Namespace, sessions.RunRequest{ExecRequest: exec, Pool: s.cfg.Pool, Keep: true,
		OwnerOnly: true, IdleTimeoutMillis: s.sessionIdleTimeout().Milliseconds(), Session: "mcp-" + randomSuffix()}, h)
	var notRun *sessions.NotRunError
	if errors.As(err, &notRun) {
		// The data plane closed the Session it could not run the code in.
		return nil, true, fmt.Errorf("lease a sandbox of pool %s/%s: %w", s.cfg.Namespace, s.cfg.Pool, err)
	}
	s.cfg.Log.Info("leased a Session for an MCP session", "session", ses.Name, "caller", l.owner)
	l.ses = ses
	return res, true, err
}

func randomSuffix() string { return strings.ReplaceAll(uuid.NewString(), "-", "")[:10] }

// leaseOf returns the lease of an MCP session that called session before.
func (s *Server) leaseOf(ss *mcp.ServerSession) *lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[ss]
}

// closeWhenDone closes the Session of an MCP session once that ends (the
// client closed it, the stream or stdin ended, or the HTTP session timed out).
func (s *Server) closeWhenDone(ss *mcp.ServerSession, l *lease) {
	_ = ss.Wait()
	s.mu.Lock()
	_, mine := s.sessions[ss]
	delete(s.sessions, ss)
	if mine {
		s.closing.Add(1) // under s.mu: a CloseAll that did not find this lease waits for it
	}
	s.mu.Unlock()
	if !mine {
		return // CloseAll took it
	}
	defer s.closing.Done()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end()
	if l.ses != nil {
		s.closeSession(l, l.ses, "its MCP session ended")
	}
}

// closeSession ends the Session of lease l, freeing its pod; why is logged.
func (s *Server) closeSession(l *lease, ses *sessions.Session, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.caller.Load().end(ctx, ses); err != nil {
		s.cfg.Log.Error(err, "could not close the Session of an MCP session (its idle timeout will)", "session", ses.Name, "reason", why)
		return
	}
	s.cfg.Log.Info("closed the Session of an MCP session", "session", ses.Name, "reason", why)
}

// CloseAll closes the Sessions of every MCP session still open: a server
// that stops leaves no sandbox behind.
func (s *Server) CloseAll() {
	s.mu.Lock()
	s.closed = true
	leases := make([]*lease, 0, len(s.sessions))
	for ss, l := range s.sessions {
		leases = append(leases, l)
		delete(s.sessions, ss)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup // in parallel: a pod's grace period does not wait for one after another
	for _, l := range leases {
		wg.Go(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.end()
			if l.ses != nil {
				s.closeSession(l, l.ses, "the MCP server stops")
			}
		})
	}
	wg.Wait()
	s.closing.Wait()
}

// answerBridge returns the bridge handler of a run of a client on a
// protocol version before 2026-07-28: llm_query (and rlm_query, as a prompt
// of its task and context) goes to the client's model as a sampling request
// of the server's own; without sampling the code gets an exception saying so.
func answerBridge(req *mcp.CallToolRequest) func(context.Context, sessions.BridgeCall) (json.RawMessage, error) {
	canSample := sampling(req)
	return func(ctx context.Context, call sessions.BridgeCall) (json.RawMessage, error) {
		if !canSample {
			return nil, noSampling(call)
		}
		prompt, err := llm.Prompt(call.Method, call.Params)
		if err != nil {
			return nil, err
		}
		res, err := req.Session.CreateMessage(ctx, samplingParams(prompt))
		if err != nil {
			return nil, fmt.Errorf("the client's model did not answer: %w", err)
		}
		text, err := responseText(res)
		if err != nil {
			return nil, err
		}
		return json.Marshal(text)
	}
}

// sampling says whether the client of req offers its model.
func sampling(req *mcp.CallToolRequest) bool {
	p := req.Session.InitializeParams()
	return p != nil && p.Capabilities != nil && p.Capabilities.Sampling != nil
}

func noSampling(call sessions.BridgeCall) error {
	return fmt.Errorf("%s has no model to ask: this MCP client does not support sampling", call.Method)
}

func samplingParams(prompt string) *mcp.CreateMessageParams {
	return &mcp.CreateMessageParams{
		MaxTokens: 4096,
		Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: prompt}}},
	}
}

// responseText is the text of the model's answer to a sampling request.
func responseText(resp any) (string, error) {
	var content []mcp.Content
	switch r := resp.(type) {
	case *mcp.CreateMessageResult:
		content = []mcp.Content{r.Content}
	case *mcp.CreateMessageWithToolsResult:
		content = r.Content
	default:
		return "", fmt.Errorf("the client answered llm_query with %T, not a sampling result", resp)
	}
	for _, c := range content {
		if text, ok := c.(*mcp.TextContent); ok {
			return text.Text, nil
		}
	}
	return "", errors.New("the client's model answered without text")
}

// toolError turns a refusal of the data plane into the message a model can act on.
func toolError(err error) error {
	var e *sessions.Error
	if errors.As(err, &e) {
		msg := strings.TrimSpace(e.Message)
		switch e.Code {
		case 403:
			return fmt.Errorf("not allowed: %s", msg)
		case 409:
			return fmt.Errorf("the sandbox cannot do this now: %s", msg)
		}
	}
	return err
}
