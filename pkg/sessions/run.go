package sessions

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Handlers receive a streamed run's events. OnBridge answers an llm_query or
// rlm_query call of the code; nil answers every call with an error.
type Handlers struct {
	OnStdout func(string)
	OnStderr func(string)
	// OnDisplay gets each rich result (a chart, display(obj)) where it
	// comes between the output; all are in Result.Displays too.
	OnDisplay func(Display)
	OnBridge  func(ctx context.Context, call BridgeCall) (json.RawMessage, error)
}

// Run runs code and waits for its result. When the answer is lost on the
// way (a data-plane replica stopped, the connection broke), Run asks the
// Session's agent about the run by its ID through any replica and returns
// its result, or sends it again only if it never arrived: the code never
// runs twice.
func (s *Session) Run(ctx context.Context, req ExecRequest) (*Result, error) {
	req.Stream, req.Bridge = false, false
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	return s.recovering(ctx, req, Handlers{}, func(Handlers) (*Result, error) {
		var res Result
		err := s.call(ctx, http.MethodPost, "exec", nil, req, &res)
		if err != nil && !isError(err) && ctx.Err() == nil && !errors.Is(err, errStreamCut) {
			err = fmt.Errorf("%w: %w", errStreamCut, err) // no answer, or one cut short
		}
		if err != nil {
			return nil, err
		}
		return &res, nil
	})
}

// RunStream runs code, hands its output to h as it comes, answers its bridge
// calls with h.OnBridge, and returns its result. Cancelling ctx before the
// result interrupts the run; RunStream then returns once the run has ended
// (or after stopTimeout), so that the Session is free for the next run. A
// stream cut before its result (a data-plane replica that stopped) is
// picked up again by run ID, as Run does.
func (s *Session) RunStream(ctx context.Context, req ExecRequest, h Handlers) (*Result, error) {
	req.Stream = true
	req.Bridge = req.Bridge || h.OnBridge != nil
	if req.ID == "" {
		// Named here, so that a cancel before the response can still stop it.
		req.ID = uuid.NewString()
	}
	return s.recovering(ctx, req, h, func(h Handlers) (*Result, error) {
		resp, err := s.do(ctx, http.MethodPost, "exec", nil, jsonBody(req), "application/json", "application/x-ndjson")
		if err != nil {
			if ctx.Err() != nil {
				s.stop(req.ID, true)
			} else if !isError(err) {
				err = fmt.Errorf("%w: %w", errStreamCut, err) // no answer at all
			}
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		res, err := s.readStream(ctx, resp.Body, req.ID, h)
		if err != nil && ctx.Err() != nil {
			s.stop(req.ID, false)
		}
		return res, err
	})
}

// stopTimeout bounds how long a cancelled RunStream waits for its run to end.
const stopTimeout = 15 * time.Second

// stop interrupts a run whose caller cancelled and waits until it ended. The
// data plane interrupts a run whose stream went away too; waiting here is
// what makes the next run of the caller not find this one still going. A
// run cancelled before its response may not have reached the agent yet
// (unknown there for a moment), or never will.
func (s *Session) stop(runID string, unsent bool) {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	unknownUntil := time.Now()
	if unsent {
		unknownUntil = unknownUntil.Add(time.Second)
	}
	interrupted := false
	for {
		info, err := s.RunInfo(ctx, runID)
		switch {
		case IsStatus(err, http.StatusNotFound) && time.Now().Before(unknownUntil):
		case err != nil || !info.Running:
			return
		case !interrupted: // once: a second SIGINT would hit the code's own cleanup
			_ = s.Interrupt(ctx, runID)
			interrupted = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Session) readStream(ctx context.Context, body io.Reader, runID string, h Handlers) (*Result, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64*1024), 32<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			// A line cut short by a connection that went away, most likely.
			return nil, fmt.Errorf("%w: decode event: %w", errStreamCut, err)
		}
		switch ev.Type {
		case EventStdout:
			if h.OnStdout != nil {
				h.OnStdout(ev.Data)
			}
		case EventStderr:
			if h.OnStderr != nil {
				h.OnStderr(ev.Data)
			}
		case EventDisplay:
			if h.OnDisplay != nil && ev.Display != nil {
				h.OnDisplay(*ev.Display)
			}
		case EventBridge:
			if ev.Call != nil {
				if err := s.answer(ctx, runID, *ev.Call, h.OnBridge); err != nil {
					return nil, err
				}
			}
		case EventResult:
			return ev.Result, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", errStreamCut, err)
	}
	return nil, fmt.Errorf("%w: the stream of run %s ended without a result", errStreamCut, runID)
}

func (s *Session) answer(ctx context.Context, runID string, call BridgeCall, on func(context.Context, BridgeCall) (json.RawMessage, error)) error {
	a := BridgeAnswer{ID: runID, Call: call.ID}
	if on == nil {
		a.Error = "this caller answers no " + call.Method + " calls"
	} else if res, err := on(ctx, call); err != nil {
		a.Error = err.Error()
	} else {
		a.Result = res
	}
	err := s.call(ctx, http.MethodPost, "bridge", nil, a, nil)
	if IsStatus(err, http.StatusNotFound) {
		// The run ended (its timeout, an interrupt) while the answer was being
		// made: nobody waits for it, and the run's result follows on the stream.
		return nil
	}
	return err
}

// send makes one request to the data plane; an answer of 300 or more is an *Error.
func (s *Session) send(ctx context.Context, method, u string, body io.Reader, contentType, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64*1024))
	e := &Error{Code: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	var st metav1.Status
	var agent struct {
		Error string `json:"error"`
	}
	switch {
	case json.Unmarshal(data, &st) == nil && st.Message != "":
		e.Reason, e.Message = string(st.Reason), st.Message
	case json.Unmarshal(data, &agent) == nil && agent.Error != "":
		e.Message = agent.Error
	default:
		e.Message = strings.TrimSpace(string(data))
	}
	return nil, e
}
