// Package sessions is the Go client of warmpool Sessions: create a Session
// (a lease on one warm, stateful Python interpreter of a SandboxPool), run
// code in it through the data plane (data.warmpool.dev) in milliseconds,
// streamed, with llm_query calls answered by the caller, and close it.
//
//	c, _ := sessions.New(restConfig)
//	s, _ := c.Create(ctx, "team-a", "nb-", "python", nil)
//	defer s.Close(context.Background())
//	res, _ := s.Run(ctx, sessions.ExecRequest{Code: "x = 6 * 7\nx"})
//	fmt.Println(*res.Result) // 42
//
// Requests go through kube-apiserver (its aggregation layer), so any
// credential of the kubeconfig works, and RBAC decides: running code needs
// "create" on sessions/exec in data.warmpool.dev for that Session.
package sessions

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
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Group and Version of the data plane.
const (
	Group   = "data.warmpool.dev"
	Version = "v1alpha1"
)

// Client creates Sessions and runs code in them.
type Client struct {
	objects client.WithWatch
	http    *http.Client
	base    string // API server URL, or the data plane's own for a direct connection
	me      *whoami
}

// whoami caches the user kube-apiserver authenticates the Client as.
type whoami struct {
	mu   sync.Mutex
	name string
}

// New returns a Client for the cluster of cfg.
func New(cfg *rest.Config) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// A logger of its own: a library must not make controller-runtime warn,
	// with a stack trace, that the program never set its global logger.
	objects, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Log: logr.New(crlog.NullLogSink{})})
	if err != nil {
		return nil, fmt.Errorf("client for Sessions: %w", err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("HTTP client for the data plane: %w", err)
	}
	return &Client{objects: objects, http: hc, base: strings.TrimRight(cfg.Host, "/"), me: &whoami{}}, nil
}

// WhoAmI returns the user kube-apiserver authenticates the Client as (a
// SelfSubjectReview, which every authenticated user may make; kubectl auth
// whoami), asked once.
func (c *Client) WhoAmI(ctx context.Context) (string, error) {
	c.me.mu.Lock()
	defer c.me.mu.Unlock()
	if c.me.name != "" {
		return c.me.name, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.objects.Create(ctx, review); err != nil {
		return "", fmt.Errorf("ask kube-apiserver who this client is (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("kube-apiserver names no user for this client's credentials")
	}
	c.me.name = review.Status.UserInfo.Username
	return c.me.name, nil
}

// WithDataPlane returns a copy of c that calls the data plane at base with
// hc directly instead of through the API server (the hop the benchmark
// measures; the data plane then authenticates hc's bearer token itself).
func (c *Client) WithDataPlane(base string, hc *http.Client) *Client {
	cp := *c
	cp.base, cp.http = strings.TrimRight(base, "/"), hc
	return &cp
}

// Options of a new Session.
type Options struct {
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	// Context is set as the variable `context` once; JSON when ContextJSON.
	Context     *string
	ContextJSON bool
	Env         map[string]string
	// OwnerOnly binds the Session to the caller (spec.access Owner): other
	// users of the namespace can neither run code in it nor read its
	// variables or files, whatever RBAC lets them do with Sessions.
	OwnerOnly bool
	// SuspendAfter suspends the Session once it is idle this long (its state
	// saved, its pod freed, resumed by its next run); nil: the pool's; 0: never.
	SuspendAfter *time.Duration
}

// Create makes a Session of pool ("name", or "namespace/name" for a shared
// pool of another namespace) in namespace (name ending in "-": a
// generated name with that prefix) and waits until it is Ready.
func (c *Client) Create(ctx context.Context, namespace, name, pool string, o *Options) (*Session, error) {
	obj := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: namespace},
		Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.ParsePoolReference(pool)}}
	if strings.HasSuffix(name, "-") {
		obj.GenerateName = name
	} else {
		obj.Name = name
	}
	// The creator is recorded whenever kube-apiserver says who the caller
	// is; a Session bound to its creator needs it.
	owner, err := c.WhoAmI(ctx)
	if err == nil {
		obj.Spec.Owner = owner
	} else if o != nil && o.OwnerOnly {
		return nil, fmt.Errorf("create a Session bound to its owner: %w", err)
	}
	if o != nil {
		if o.OwnerOnly {
			obj.Spec.Access = sandboxv1alpha1.SessionAccessOwner
		}
		if o.IdleTimeout > 0 {
			obj.Spec.IdleTimeout = &metav1.Duration{Duration: o.IdleTimeout}
		}
		if o.MaxLifetime > 0 {
			obj.Spec.MaxLifetime = &metav1.Duration{Duration: o.MaxLifetime}
		}
		if o.SuspendAfter != nil {
			obj.Spec.SuspendAfter = &metav1.Duration{Duration: *o.SuspendAfter}
		}
		obj.Spec.Context = o.Context
		if o.ContextJSON {
			obj.Spec.ContextFormat = sandboxv1alpha1.ContextJSON
		}
		for k, v := range o.Env {
			obj.Spec.Env = append(obj.Spec.Env, sandboxv1alpha1.EnvVar{Name: k, Value: v})
		}
	}
	if err := c.objects.Create(ctx, obj); err != nil {
		return nil, fmt.Errorf("create Session: %w", err)
	}
	s := c.Open(namespace, obj.Name)
	if _, err := s.WaitReady(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// Open returns a handle on an existing Session.
func (c *Client) Open(namespace, name string) *Session {
	return &Session{c: c, Namespace: namespace, Name: name}
}

// Session is a handle on one Session.
type Session struct {
	c         *Client
	Namespace string
	Name      string
}

// Get reads the Session object.
func (s *Session) Get(ctx context.Context) (*sandboxv1alpha1.Session, error) {
	obj := &sandboxv1alpha1.Session{}
	if err := s.c.objects.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.Name}, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// WaitReady watches the Session until it is Ready; a Session that ended
// first is an error that says why.
func (s *Session) WaitReady(ctx context.Context) (*sandboxv1alpha1.Session, error) {
	for {
		var list sandboxv1alpha1.SessionList
		if err := s.c.objects.List(ctx, &list, client.InNamespace(s.Namespace),
			client.MatchingFields{"metadata.name": s.Name}); err != nil {
			return nil, err
		}
		if len(list.Items) == 0 {
			return nil, fmt.Errorf("session %s not found in namespace %s", s.Name, s.Namespace)
		}
		obj := &list.Items[0]
		if done, err := readyOrEnded(s.Name, obj); done {
			return obj, err
		}
		w, err := s.c.objects.Watch(ctx, &sandboxv1alpha1.SessionList{}, client.InNamespace(s.Namespace),
			client.MatchingFields{"metadata.name": s.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			return nil, err
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return obj, fmt.Errorf("session %s was deleted before it was Ready", s.Name)
			}
			if o, ok := ev.Object.(*sandboxv1alpha1.Session); ok {
				obj = o
				if done, err := readyOrEnded(s.Name, obj); done {
					w.Stop()
					return obj, err
				}
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return obj, fmt.Errorf("session %s not Ready (%s): %w", s.Name, readyMessage(obj), ctx.Err())
		}
		// The watch ended (a timeout of the API server): list and watch again.
	}
}

func readyOrEnded(name string, obj *sandboxv1alpha1.Session) (bool, error) {
	switch obj.Status.Phase {
	case sandboxv1alpha1.SessionReady:
		return true, nil
	case sandboxv1alpha1.SessionClosed, sandboxv1alpha1.SessionLost:
		return true, fmt.Errorf("session %s is %s: %s", name, obj.Status.Phase, readyMessage(obj))
	}
	return false, nil
}

func readyMessage(obj *sandboxv1alpha1.Session) string {
	for _, c := range obj.Status.Conditions {
		if c.Type == sandboxv1alpha1.SessionConditionReady {
			return c.Reason + ": " + c.Message
		}
	}
	return "no status yet"
}

// Close deletes the Session; its pod goes back to the pool.
func (s *Session) Close(ctx context.Context) error {
	obj := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}}
	return client.IgnoreNotFound(s.c.objects.Delete(ctx, obj))
}

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

// maxResends bounds how often a run that never reached its agent is sent
// again, the first time after resendDelay, then twice as long each time.
const (
	maxResends  = 3
	resendDelay = 200 * time.Millisecond
)

// recovering sends a run with send (which streams to the handlers it is
// given) and, when its answer was lost (no
// answer, a stream cut before the result, a proxy that could not reach the
// replica), finds out what became of it by its ID (recoverRun): its result,
// or the rest of its stream, or, if it never arrived, a new send.
func (s *Session) recovering(ctx context.Context, req ExecRequest, h Handlers, send func(Handlers) (*Result, error)) (*Result, error) {
	// What reached the caller's handlers: an attach gets the run's result,
	// not its live output again, so the rest of its output is handed on
	// from the result.
	var streamedOut, streamedErr strings.Builder
	counted := h
	if h.OnStdout != nil {
		counted.OnStdout = func(d string) { streamedOut.WriteString(d); h.OnStdout(d) }
	}
	if h.OnStderr != nil {
		counted.OnStderr = func(d string) { streamedErr.WriteString(d); h.OnStderr(d) }
	}
	for resends := 0; ; resends++ {
		res, err := send(counted)
		if notSent(err) {
			// Refused before it was sent on (the API server could not reach a
			// replica, or the replica is not ready), or never sent: it did not run.
			if resends == maxResends {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(resendDelay << resends):
				continue
			}
		}
		if err != nil && ctx.Err() == nil && (errors.Is(err, errStreamCut) || replicaGone(err)) {
			res, err = s.recoverRun(ctx, RunRequest{ExecRequest: req}, counted)
			var notRun *NotRunError
			if errors.As(err, &notRun) && resends < maxResends {
				continue // it never ran: sending it again cannot run it twice
			}
		}
		if err == nil && res != nil {
			// A send again, with the run's ID, attaches when the run did
			// arrive after all (a refusal that came from a replica going away
			// after it forwarded it): the answer is then its result alone.
			handOnRest(res.Stdout, streamedOut.String(), h.OnStdout)
			handOnRest(res.Stderr, streamedErr.String(), h.OnStderr)
		}
		return res, err
	}
}

// notSent reports an answer that says the request went nowhere: a 503 (the
// API server could not reach a replica, or the replica is not ready yet) or
// a connection that could not be made.
func notSent(err error) bool {
	var op *net.OpError
	return IsStatus(err, http.StatusServiceUnavailable) || (errors.As(err, &op) && op.Op == "dial")
}

// handOnRest gives on the part of all after what was already streamed (when
// all begins with it: a result whose output was cut short does not).
func handOnRest(all, streamed string, on func(string)) {
	if on != nil && len(all) > len(streamed) && strings.HasPrefix(all, streamed) {
		on(all[len(streamed):])
	}
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

// Interrupt sends SIGINT to a run (KeyboardInterrupt in the code).
func (s *Session) Interrupt(ctx context.Context, runID string) error {
	return s.call(ctx, http.MethodPost, "interrupt", nil, RunRef{ID: runID}, nil)
}

// RunInfo returns a run's state, and its result once it ended.
func (s *Session) RunInfo(ctx context.Context, runID string) (*RunInfo, error) {
	var info RunInfo
	if err := s.call(ctx, http.MethodGet, "executions", url.Values{"id": {runID}}, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Variable reads a global of the interpreter.
func (s *Session) Variable(ctx context.Context, name string) (*Variable, error) {
	var v Variable
	if err := s.call(ctx, http.MethodGet, "variables", url.Values{"name": {name}}, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// ReadFile reads a file of the Session's workspace.
func (s *Session) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := s.do(ctx, http.MethodGet, "files", url.Values{"path": {path}}, nil, "", "")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return io.ReadAll(resp.Body)
}

// WriteFile writes a file of the Session's workspace.
func (s *Session) WriteFile(ctx context.Context, path string, data []byte) error {
	resp, err := s.do(ctx, http.MethodPut, "files", url.Values{"path": {path}}, bytes.NewReader(data), "application/octet-stream", "")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// ListFiles lists a directory of the Session's workspace ("" is its root).
func (s *Session) ListFiles(ctx context.Context, path string) ([]FileInfo, error) {
	var out []FileInfo
	if err := s.call(ctx, http.MethodGet, "files", url.Values{"path": {path}, "list": {"true"}}, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Reset gives the Session a fresh interpreter: its variables are gone, its
// files stay.
func (s *Session) Reset(ctx context.Context) error {
	return s.call(ctx, http.MethodPost, "reset", nil, struct{}{}, nil)
}

// Snapshot streams the Session's state (pkg/snapshot); the caller reads and
// closes it. workspace adds the workspace's files.
func (s *Session) Snapshot(ctx context.Context, workspace bool) (io.ReadCloser, error) {
	var q url.Values
	if workspace {
		q = url.Values{protocol.QueryWorkspace: {"true"}}
	}
	resp, err := s.do(ctx, http.MethodGet, "snapshot", q, nil, "", snapshot.MediaType)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Restore replaces the Session's state with a snapshot's.
func (s *Session) Restore(ctx context.Context, snap io.Reader) (*RestoreResponse, error) {
	resp, err := s.do(ctx, http.MethodPost, "restore", nil, snap, snapshot.MediaType, "application/json")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var out RestoreResponse
	return &out, json.NewDecoder(resp.Body).Decode(&out)
}

// Fork copies the Session into new Sessions, server-side.
func (s *Session) Fork(ctx context.Context, req ForkRequest) (*ForkResponse, error) {
	var out ForkResponse
	if err := s.call(ctx, http.MethodPost, "fork", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (s *Session) url(sub string, q url.Values) string {
	u := fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/sessions/%s/%s", s.c.base, Group, Version,
		url.PathEscape(s.Namespace), url.PathEscape(s.Name), sub)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

func (s *Session) call(ctx context.Context, method, sub string, q url.Values, body, out any) error {
	var rd io.Reader
	ct := ""
	if body != nil {
		rd, ct = jsonBody(body), "application/json"
	}
	resp, err := s.do(ctx, method, sub, q, rd, ct, "application/json")
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

func (s *Session) do(ctx context.Context, method, sub string, q url.Values, body io.Reader, contentType, accept string) (*http.Response, error) {
	resp, err := s.send(ctx, method, s.url(sub, q), body, contentType, accept)
	if err != nil && !isError(err) {
		return nil, fmt.Errorf("%s %s of session %s: %w", method, sub, s.Name, err)
	}
	return resp, err
}

func isError(err error) bool {
	var e *Error
	return errors.As(err, &e)
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

// replicaGone reports an answer of the API server's proxy that it could not
// reach the data-plane replica it chose (502, 503), given before a stream began.
func replicaGone(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Code == http.StatusBadGateway || e.Code == http.StatusServiceUnavailable)
}

// errStreamCut marks a run's stream that ended before its result.
var errStreamCut = errors.New("stream cut")

// NotRunError says that a one-call run's code did not run: sending it again
// cannot run it twice.
type NotRunError struct {
	Session string
	Err     error
}

func (e *NotRunError) Error() string {
	return fmt.Sprintf("the code did not run (Session %s): %v", e.Session, e.Err)
}

func (e *NotRunError) Unwrap() error { return e.Err }

// recoverGrace is how long a run unknown to its agent may still arrive
// there (a request the gone replica had sent, in flight).
const recoverGrace = time.Second

// recoverTimeout bounds the search for a run whose answer was lost; askTimeout
// bounds one question on the way. The API server's proxy may still send a
// question to the replica that went away, whose address then answers nothing
// at all: such a question hangs until its own deadline, and the next one goes
// to a replica that serves. attachTimeout bounds an attach's wait for its
// response to begin, longer: an attach given up after it reached a replica
// counts as its caller gone, and the data plane interrupts the run, so only a
// replica that answers nothing for that long is given up on (a starved node
// answers a live attach late, not never).
var (
	recoverTimeout = time.Minute
	askTimeout     = 5 * time.Second
	attachTimeout  = 20 * time.Second
)

// errNoAnswer: an attach whose response did not begin within attachTimeout.
var errNoAnswer = errors.New("no answer in time")

// recoverRun finds out what became of a one-call run whose answer was lost.
func (s *Session) recoverRun(ctx context.Context, req RunRequest, h Handlers) (*Result, error) {
	// The budget bounds the search, not the run found: an attached run is
	// followed for as long as the caller waits.
	search, cancel := context.WithTimeout(ctx, recoverTimeout)
	defer cancel()
	unknownUntil := time.Now().Add(recoverGrace)
	var last error
	for {
		actx, acancel := context.WithTimeout(search, askTimeout)
		info, err := s.RunInfo(actx, req.ID)
		acancel()
		switch {
		case err == nil && info.Running:
			// It runs: attach to it (the same ID attaches, never runs again).
			res, aerr := s.attach(ctx, req.ExecRequest, h)
			if !replicaGone(aerr) && !errors.Is(aerr, errNoAnswer) {
				return res, aerr
			}
			// The attach went to the replica that is going away (the
			// aggregator still lists it for a moment): nothing streamed yet,
			// so ask again through another one.
			err = aerr
		case err == nil && info.Result != nil:
			return info.Result, nil
		case IsStatus(err, http.StatusNotFound) && time.Now().After(unknownUntil):
			// Unknown to the Session's agent (or no such Session): never sent.
			return nil, &NotRunError{Session: s.Name, Err: err}
		case IsStatus(err, http.StatusConflict):
			// The Session is not Ready: Pending (nobody will send the run
			// now), or ended, and with it whatever ran on it.
			obj, gerr := s.Get(search)
			if gerr == nil && obj.Status.Phase == sandboxv1alpha1.SessionPending {
				return nil, &NotRunError{Session: s.Name, Err: err}
			}
			return nil, fmt.Errorf("the answer of run %s was lost and its Session %s ended: whether the code ran is unknown: %w", req.ID, s.Name, err)
		}
		if err != nil {
			last = err
		}
		select {
		case <-search.Done():
			return nil, fmt.Errorf("the answer of run %s was lost, and asking about it failed for %s (last: %v): %w", req.ID, recoverTimeout, last, search.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// attach streams a run that is running, by its ID, to h. A response that does
// not begin within attachTimeout is given up (errNoAnswer): no replica had
// the request, most likely (one that has it answers at once, before the run's
// output), and the caller asks again.
func (s *Session) attach(ctx context.Context, exec ExecRequest, h Handlers) (*Result, error) {
	exec.Stream = true
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(attachTimeout, func() { cancel(errNoAnswer) })
	resp, err := s.do(actx, http.MethodPost, "exec", nil, jsonBody(exec), "application/json", "application/x-ndjson")
	if !timer.Stop() {
		if resp != nil {
			_ = resp.Body.Close()
		}
		return nil, errNoAnswer
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return s.readStream(actx, resp.Body, exec.ID, h)
}

// End ends the Session (spec.close) rather than deleting it: its pod goes
// back to the pool, and the Session stays listed, Closed (with its last
// runs' outcomes), until its TTL. A caller who may delete Sessions but not
// patch them deletes it.
func (s *Session) End(ctx context.Context) error {
	obj := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}}
	err := s.c.objects.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"close":true}}`)))
	if apierrors.IsForbidden(err) {
		return s.Close(ctx)
	}
	return client.IgnoreNotFound(err)
}
