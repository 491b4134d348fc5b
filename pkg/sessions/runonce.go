package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/uuid"
)

// RunOnce runs code in a new Session of pool, in one request to the data
// plane: it creates the Session (owned by the caller), waits there until a
// warm interpreter is leased and runs req's code, streaming to h when h has
// handlers or req.Stream is set. Unless req.Keep, the Session is closed as
// the response ends; with it, the returned Session takes more runs.
//
// When the answer is lost on the way (a data-plane replica or the network
// went away), RunOnce asks the Session's agent, through any replica, about
// the run by its ID: it returns the run's result if it ran, attaching to it
// if it still runs, or a *NotRunError if it did not run (then it is safe to
// send again). The code never runs twice.
func (c *Client) RunOnce(ctx context.Context, namespace string, req RunRequest, h Handlers) (*Result, *Session, error) {
	if req.Session == "" {
		// Named here, so that the caller can ask about it whatever happens to the answer.
		req.Session = "run-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
	}
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	req.Bridge = req.Bridge || h.OnBridge != nil
	stream := req.Stream || req.Bridge || h.OnStdout != nil || h.OnStderr != nil || h.OnDisplay != nil
	req.Stream = stream
	s := c.Open(namespace, req.Session)
	accept := "application/json"
	if stream {
		accept = "application/x-ndjson"
	}
	u := fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/runs/%s/exec", c.base, Group, Version, url.PathEscape(namespace), url.PathEscape(req.Session))
	resp, err := s.send(ctx, http.MethodPost, u, jsonBody(req), "application/json", accept)
	var res *Result
	if err == nil {
		defer func() { _ = resp.Body.Close() }()
		if stream {
			res, err = s.readStream(ctx, resp.Body, req.ID, h)
		} else {
			res = &Result{}
			if derr := json.NewDecoder(resp.Body).Decode(res); derr != nil {
				res, err = nil, fmt.Errorf("%w: decode the result of run %s: %w", errStreamCut, req.ID, derr)
			}
		}
		if err == nil {
			return res, s, nil
		}
	}
	var e *Error
	if resp == nil && errors.As(err, &e) && e.Code != http.StatusBadGateway {
		// The data plane (or kube-apiserver) answered before it ran the code.
		return nil, s, &NotRunError{Session: s.Name, Err: err}
	}
	if ctx.Err() != nil || (resp != nil && !errors.Is(err, errStreamCut)) {
		// The caller gave up (the data plane interrupts a streamed run whose
		// request went away), or answering a bridge call of the run failed.
		if !req.Keep {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
			defer cancel()
			_ = s.End(cctx)
		}
		return nil, s, err
	}
	res, rerr := s.recoverRun(ctx, req, h)
	var notRun *NotRunError
	if !req.Keep || errors.As(rerr, &notRun) { // a Session whose code never ran is nobody's, kept or not
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		_ = s.End(cctx)
	}
	if rerr != nil {
		return nil, s, rerr
	}
	return res, s, nil
}
