// Package client calls the agent's HTTP API, over TCP or a Unix socket. The
// manager and the agent's own CLI use it.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Client talks to one agent.
type Client struct {
	base   string
	token  string
	tokens func() (string, error)
	http   *http.Client
}

// WithTokenSource makes the client ask tokens() for the bearer token of every
// request instead of using a fixed one: tokens that expire, signed per pod.
func (c *Client) WithTokenSource(tokens func() (string, error)) *Client {
	c.tokens = tokens
	return c
}

// New returns a client for baseURL (http://host:port) with a bearer token and
// a connection pool of its own.
func New(baseURL, token string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	return NewWithHTTP(baseURL, token, &http.Client{Transport: tr})
}

// NewWithHTTP returns a client that shares hc (and its connection pool) with
// other clients: the manager talks to many short-lived pods through one pool.
func NewWithHTTP(baseURL, token string, hc *http.Client) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, http: hc}
}

// NewUnix returns a client for an agent serving on a Unix socket.
func NewUnix(socket, token string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 16,
	}
	return &Client{base: "http://agent", token: token, http: &http.Client{Transport: tr}}
}

// APIError is a non-2xx answer of the agent.
type APIError struct {
	Code    int
	Message string
	// Reason names the error for a program (protocol.ReasonSealed), if the agent did.
	Reason string
}

func (e *APIError) Error() string { return fmt.Sprintf("agent: %d: %s", e.Code, e.Message) }

// IsAPIError reports whether err is (or wraps) an answer of the agent, as
// opposed to a failure to reach it or to read its answer.
func IsAPIError(err error) bool {
	var ae *APIError
	return errors.As(err, &ae)
}

// IsStatus reports whether err is, or wraps, an APIError with this HTTP status.
func IsStatus(err error, code int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

func (c *Client) do(ctx context.Context, method, path string, body any, accept string) (*http.Response, error) {
	var rd io.Reader
	contentType := ""
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd, contentType = bytes.NewReader(b), "application/json"
	}
	resp, err := c.Raw(ctx, method, path, rd, contentType, accept)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, apiError(resp)
	}
	return resp, nil
}

// apiError reads a non-2xx answer and closes its body.
func apiError(resp *http.Response) error {
	defer func() { _ = resp.Body.Close() }()
	var eb protocol.ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64*1024))
	if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
		eb.Error = strings.TrimSpace(string(data))
	}
	return &APIError{Code: resp.StatusCode, Message: eb.Error, Reason: eb.Reason}
}

// IsSealed reports whether err says the sandbox was sealed by a suspend.
func IsSealed(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Reason == protocol.ReasonSealed
}

// SnapshotOptions of Snapshot.
type SnapshotOptions struct {
	// Workspace adds the workspace's files.
	Workspace bool
	// Seal refuses everything that would change the sandbox afterwards
	// (protocol.QuerySeal): the snapshot is the Session's last state here.
	Seal bool
	// MaxBytes bounds the snapshot; 0: the agent's limit.
	MaxBytes int64
	// Checkpoint: a durable Session's checkpoint, which is not its activity
	// (protocol.QueryCheckpoint).
	Checkpoint bool
}

// RestoreOptions say what a restore is besides the snapshot.
type RestoreOptions struct {
	// Unseal lets a sealed sandbox (the one a Session was suspended from) take it.
	Unseal bool
	// Moved is said by the next run (protocol.QueryMoved).
	Moved *protocol.Moved
	// Runs is how many runs the state has seen: the next run is numbered one more.
	Runs int64
}

// Snapshot streams a snapshot of the interpreter (pkg/snapshot); the caller
// reads and closes it. size is its length.
func (c *Client) Snapshot(ctx context.Context, o SnapshotOptions) (body io.ReadCloser, size int64, err error) {
	q := url.Values{}
	if o.Workspace {
		q.Set(protocol.QueryWorkspace, "true")
	}
	if o.Seal {
		q.Set(protocol.QuerySeal, "true")
	}
	if o.MaxBytes > 0 {
		q.Set(protocol.QueryMaxBytes, strconv.FormatInt(o.MaxBytes, 10))
	}
	if o.Checkpoint {
		q.Set(protocol.QueryCheckpoint, "true")
	}
	path := protocol.PathSnapshot
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.Raw(ctx, http.MethodPost, path, nil, "", snapshot.MediaType)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode >= 300 {
		return nil, 0, apiError(resp)
	}
	return resp.Body, resp.ContentLength, nil
}

// Restore replaces the interpreter's namespace (and adds the workspace's
// files) with a snapshot's.
func (c *Client) Restore(ctx context.Context, snap io.Reader, o RestoreOptions) (*protocol.Restored, error) {
	q := url.Values{}
	if o.Unseal {
		q.Set(protocol.QueryUnseal, "true")
	}
	if o.Runs > 0 {
		q.Set(protocol.QueryRuns, strconv.FormatInt(o.Runs, 10))
	}
	if moved := o.Moved; moved != nil {
		b, err := json.Marshal(moved)
		if err != nil {
			return nil, fmt.Errorf("encode the move: %w", err)
		}
		q.Set(protocol.QueryMoved, string(b))
	}
	path := protocol.PathRestore
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.Raw(ctx, http.MethodPost, path, snap, snapshot.MediaType, "")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, apiError(resp)
	}
	defer func() { _ = resp.Body.Close() }()
	var out protocol.Restored
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("read the agent's answer to a restore: %w", err)
	}
	return &out, nil
}

// Unseal lets the sandbox run again after a sealing snapshot whose suspend
// did not commit.
func (c *Client) Unseal(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, protocol.PathUnseal, nil, nil)
}

// Raw sends one request to the agent and returns its response whatever the
// status, for callers that pass the agent's answer on (the data plane). The
// caller closes the body.
func (c *Client) Raw(ctx context.Context, method, path string, body io.Reader, contentType, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	token := c.token
	if c.tokens != nil {
		if token, err = c.tokens(); err != nil {
			return nil, fmt.Errorf("agent token: %w", err)
		}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return c.http.Do(req)
}

func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.do(ctx, method, path, body, "")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Execute runs code and waits for the result. Calling it again with the same
// ID attaches to the same execution.
func (c *Client) Execute(ctx context.Context, req protocol.ExecuteRequest) (*protocol.Result, error) {
	req.Stream = false
	var res protocol.Result
	if err := c.call(ctx, http.MethodPost, protocol.PathExecute, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecuteStream runs code and calls onEvent for each event, the final result last.
func (c *Client) ExecuteStream(ctx context.Context, req protocol.ExecuteRequest, onEvent func(protocol.Event)) (*protocol.Result, error) {
	req.Stream = true
	resp, err := c.do(ctx, http.MethodPost, protocol.PathExecute, req, protocol.ContentTypeNDJSON)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		var ev protocol.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decode event: %w", err)
		}
		if onEvent != nil {
			onEvent(ev)
		}
		if ev.Type == protocol.EventResult {
			return ev.Result, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("stream ended without a result")
}

// AnswerBridge answers a bridge call of a streamed execution.
func (c *Client) AnswerBridge(ctx context.Context, execID, callID string, a protocol.BridgeAnswer) error {
	return c.call(ctx, http.MethodPost, "/v1/executions/"+url.PathEscape(execID)+"/bridge/"+url.PathEscape(callID), a, nil)
}

// Execution returns what the agent knows of an execution; an APIError 404 when nothing.
func (c *Client) Execution(ctx context.Context, id string) (*protocol.ExecutionInfo, error) {
	var info protocol.ExecutionInfo
	if err := c.call(ctx, http.MethodGet, "/v1/executions/"+url.PathEscape(id), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Interrupt sends SIGINT to a running execution.
func (c *Client) Interrupt(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodPost, "/v1/executions/"+url.PathEscape(id)+"/interrupt", nil, nil)
}

// Variable reads a global of the interpreter.
func (c *Client) Variable(ctx context.Context, name string) (*protocol.Variable, error) {
	var v protocol.Variable
	if err := c.call(ctx, http.MethodGet, "/v1/variables/"+url.PathEscape(name), nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Reset replaces the interpreter with a fresh one.
func (c *Client) Reset(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, protocol.PathReset, nil, nil)
}

// ResetForReuse replaces the interpreter and empties the workspace and the
// agent's scratch directories: the pod goes to another user.
func (c *Client) ResetForReuse(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, protocol.PathReset+"?"+protocol.QueryWipe+"=true", nil, nil)
}

// Shell runs a command in the workspace.
func (c *Client) Shell(ctx context.Context, req protocol.ShellRequest) (*protocol.ShellResult, error) {
	var res protocol.ShellResult
	if err := c.call(ctx, http.MethodPost, protocol.PathShell, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Ready returns the agent's readiness; an APIError 503 while not ready.
func (c *Client) Ready(ctx context.Context) (*protocol.Health, error) {
	var h protocol.Health
	if err := c.call(ctx, http.MethodGet, protocol.PathReadyz, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Quiet waits, at most wait, until the agent has started more than after
// runs and nothing runs (protocol.PathQuiet).
func (c *Client) Quiet(ctx context.Context, after int64, wait time.Duration) (*protocol.Quiet, error) {
	q := url.Values{}
	q.Set(protocol.QueryAfter, strconv.FormatInt(after, 10))
	q.Set(protocol.QueryWaitMillis, strconv.FormatInt(wait.Milliseconds(), 10))
	var out protocol.Quiet
	if err := c.call(ctx, http.MethodGet, protocol.PathQuiet+"?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Health returns the agent's liveness answer, which says its build and
// protocol version; unlike Ready it is 200 while a run is under way.
func (c *Client) Health(ctx context.Context) (*protocol.Health, error) {
	var h protocol.Health
	if err := c.call(ctx, http.MethodGet, protocol.PathHealthz, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// WaitReady polls readiness until the agent is ready or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	for {
		if _, err := c.Ready(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
