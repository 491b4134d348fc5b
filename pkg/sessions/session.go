package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

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
