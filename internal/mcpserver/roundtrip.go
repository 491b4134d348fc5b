package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warmpool/warmpool/internal/llm"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// From protocol version 2026-07-28 on (SEP-2322), a server may not send
// sampling requests of its own while it serves a tool call: it returns the
// request inside the call's result ("input required"), the client asks its
// model and calls the tool again with the answer and the opaque request state
// of that result. A run whose code waits on llm_query cannot end with the
// call, so for such clients the run goes on in the background between the
// rounds: each llm_query ends the current round with an input request, and
// the next call, naming the round's state, hands the answer to the waiting
// code and waits for the run's next question or its result.

// answerTimeout bounds how long the code of a run waits for a client that
// was asked a question and has not called again: the client may have given
// up (its model failed, its retry budget is spent), and the code then gets
// an exception instead of holding the sandbox until the run's timeout.
const answerTimeout = 5 * time.Minute

// roundTrip is a run_code that is carried over several tools/call rounds.
type roundTrip struct {
	// state and asked are read and written by rounds only, which the
	// lease's serial mutex keeps to one at a time.
	state  string             // the request state of the round the client must answer; "" while a round is served
	cancel context.CancelFunc // interrupts the code and ends the run
	asks   chan *question     // the code's llm_query calls, one at a time (the stream answers them in order)
	asked  *question          // the question of the last round, awaiting its answer
	done   chan struct{}      // closed when the run ended; res and err are then set
	res    *sessions.Result
	err    error
}

type question struct {
	id     string
	params *mcp.CreateMessageParams
	answer chan answer // buffered: the run may have ended when it comes
}

type answer struct {
	text string
	err  error
}

// multiRoundTrip says whether the client of req speaks a protocol version
// on which sampling must be embedded in results.
func multiRoundTrip(req *mcp.CallToolRequest) bool {
	p := req.Session.InitializeParams()
	return p != nil && p.ProtocolVersion >= "2026-07-28"
}

// startRoundTrip starts a run in the background, its bridge calls turned
// into questions for the rounds.
func startRoundTrip(ses *sessions.Session, exec sessions.ExecRequest, sampling bool) *roundTrip {
	ctx, cancel := context.WithCancel(context.Background())
	rt := &roundTrip{cancel: cancel, asks: make(chan *question), done: make(chan struct{})}
	onBridge := func(ctx context.Context, call sessions.BridgeCall) (json.RawMessage, error) {
		if !sampling {
			return nil, noSampling(call)
		}
		prompt, err := llm.Prompt(call.Method, call.Params)
		if err != nil {
			return nil, err
		}
		q := &question{id: call.ID, params: samplingParams(prompt), answer: make(chan answer, 1)}
		select {
		case rt.asks <- q:
		case <-time.After(answerTimeout): // no round took it: the client stopped calling
			return nil, fmt.Errorf("%s: the MCP client did not call again within %s", call.Method, answerTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		select {
		case a := <-q.answer:
			if a.err != nil {
				return nil, a.err
			}
			return json.Marshal(a.text)
		case <-time.After(answerTimeout):
			return nil, fmt.Errorf("%s: the MCP client did not answer within %s", call.Method, answerTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	go func() {
		defer close(rt.done)
		rt.res, rt.err = ses.RunStream(ctx, exec, sessions.Handlers{OnBridge: onBridge})
	}()
	return rt
}

// answer hands the client's response to the question of the last round.
func (rt *roundTrip) answer(responses mcp.InputResponseMap) {
	q := rt.asked
	rt.asked = nil
	if q == nil {
		return
	}
	resp, ok := responses[q.id]
	if !ok {
		q.answer <- answer{err: errors.New("the MCP client called again without an answer to llm_query")}
		return
	}
	text, err := responseText(resp)
	q.answer <- answer{text: text, err: err}
}

// next waits for the run's next question, which it returns as the input
// requests of a new round (with a fresh state), or for its end. A caller
// that goes away interrupts the run, as a cancelled call does on older
// protocol versions.
func (rt *roundTrip) next(ctx context.Context) (*mcp.CallToolResult, *sessions.Result, error) {
	select {
	case q := <-rt.asks:
		state, err := newState()
		if err != nil {
			rt.stop()
			return nil, nil, err
		}
		rt.asked, rt.state = q, state
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{q.id: q.params}, RequestState: state}, nil, nil
	case <-rt.done:
		return nil, rt.res, rt.err
	case <-ctx.Done():
		rt.stop()
		return nil, nil, ctx.Err()
	}
}

// running says whether the run has not ended yet.
func (rt *roundTrip) running() bool {
	select {
	case <-rt.done:
		return false
	default:
		return true
	}
}

// stop interrupts the run and waits (boundedly) for it to end.
func (rt *roundTrip) stop() {
	rt.cancel()
	select {
	case <-rt.done:
	case <-time.After(30 * time.Second):
	}
}

func newState() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("request state: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// runCodeRoundTrips serves run_code for clients on protocol 2026-07-28 and
// later: a call without request state starts a run (interrupting one the
// client abandoned between rounds); a call with one answers that round. The
// caller holds l.serial, so one round of an MCP session is served at a time.
func (s *Server) runCodeRoundTrips(ctx context.Context, req *mcp.CallToolRequest, l *lease, ses *sessions.Session,
	exec sessions.ExecRequest) (*mcp.CallToolResult, *sessions.Result, error) {
	l.runMu.Lock()
	rt := l.rt
	l.runMu.Unlock()
	if state := req.Params.RequestState; state != "" {
		if rt == nil || rt.state != state {
			return nil, nil, errors.New("this run_code round is unknown or over (the run ended, or was interrupted): call run_code again without requestState")
		}
		rt.state = "" // a second call with the same state is refused
		rt.answer(req.Params.InputResponses)
	} else {
		if rt != nil {
			rt.stop() // the client gave up on it between rounds
		}
		rt = startRoundTrip(ses, exec, sampling(req))
		l.runMu.Lock()
		if l.closed {
			l.runMu.Unlock()
			rt.stop()
			return nil, nil, errors.New("this MCP session has ended")
		}
		l.rt = rt
		l.runMu.Unlock()
	}

	result, res, err := rt.next(ctx)
	if result == nil { // the run ended (or the caller left): the next call starts afresh
		l.runMu.Lock()
		if l.rt == rt {
			l.rt = nil
		}
		l.runMu.Unlock()
	}
	return result, res, err
}
