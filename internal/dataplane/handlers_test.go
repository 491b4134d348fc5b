package dataplane

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// A reset records the Session's interpreter twice; other writes of the
// Session in between (its activity) must not fail it, an overlapping reset must.
func TestSetInterpreterRetriesOtherWritesButNotAnotherReset(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "u1"},
		Status: sandboxv1alpha1.SessionStatus{Phase: sandboxv1alpha1.SessionReady, PodName: "p", Interpreter: "old"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ses).WithStatusSubresource(ses).Build()
	s := &Server{Client: c, APIReader: c}
	read := func() *sandboxv1alpha1.Session {
		got := &sandboxv1alpha1.Session{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(ses), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	stale := read()
	activity := read()
	activity.Status.Runs = 7 // the Session controller's write, after the data plane read the Session
	if err := c.Status().Update(ctx, activity); err != nil {
		t.Fatal(err)
	}
	if err := s.setInterpreter(ctx, stale, "old", ""); err != nil {
		t.Fatalf("a write of the activity in between must not fail the reset: %v", err)
	}
	if got := read(); got.Status.Interpreter != "" || got.Status.Runs != 7 {
		t.Fatalf("want the interpreter cleared and the activity kept, got %+v", got.Status)
	}

	mine := read()
	other := read()
	other.Status.Interpreter = "theirs" // an overlapping reset recorded its interpreter first
	if err := c.Status().Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	err := s.setInterpreter(ctx, mine, "", "mine")
	if !apierrors.IsConflict(err) {
		t.Fatalf("an overlapping reset must fail this one with a conflict, got %v", err)
	}
	if got := read(); got.Status.Interpreter != "theirs" {
		t.Fatalf("the other reset's interpreter must stand, got %q", got.Status.Interpreter)
	}
}

// Every error the data plane answers is a metav1.Status, as docs/sessions.md
// promises and Kubernetes clients read: the agent's own {"error": ...}
// answers too, with the agent's code and the reason Kubernetes gives it.
func TestAgentErrorsBecomeStatuses(t *testing.T) {
	for _, tc := range []struct {
		code   int
		body   string
		reason metav1.StatusReason
		msg    string
	}{
		{http.StatusNotFound, `{"error":"no variable \"x\""}`, metav1.StatusReasonNotFound, `sandbox agent: no variable "x"`},
		{http.StatusRequestEntityTooLarge, `{"error":"file larger than 64 MiB"}`, metav1.StatusReasonRequestEntityTooLarge, "sandbox agent: file larger than 64 MiB"},
		{http.StatusConflict, `not json`, metav1.StatusReasonConflict, "sandbox agent: not json"},
		{http.StatusInternalServerError, `{"error":"boom"}`, metav1.StatusReasonInternalError, "sandbox agent: boom"},
	} {
		rec := httptest.NewRecorder()
		relay(rec, &http.Response{StatusCode: tc.code, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(tc.body))})
		var st metav1.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != tc.code || st.Kind != "Status" ||
			st.Code != int32(tc.code) || st.Reason != tc.reason || st.Message != tc.msg {
			t.Errorf("agent %d %s: got %d %s (%v)", tc.code, tc.body, rec.Code, rec.Body.String(), err)
		}
	}
	rec := httptest.NewRecorder()
	relay(rec, &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"status":"succeeded"}`))})
	if rec.Code != http.StatusOK || rec.Body.String() != `{"status":"succeeded"}` {
		t.Errorf("a success is relayed as it is: %d %s", rec.Code, rec.Body.String())
	}
}

func TestATooLargeBodyIs413(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"code":"`+strings.Repeat("x", maxRequestBytes)+`"}`))
	var v map[string]any
	if decode(rec, req, &v) {
		t.Fatal("a body over the limit was decoded")
	}
	var st metav1.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusRequestEntityTooLarge ||
		st.Reason != metav1.StatusReasonRequestEntityTooLarge {
		t.Fatalf("got %d %s", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	if decode(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"code":`)), &v) || rec.Code != http.StatusBadRequest {
		t.Fatalf("a malformed body is 400, got %d", rec.Code)
	}
}

// A restore clears the restoring annotation and answers; the caller's next
// run may land here before this replica's cache has heard (or on another
// replica). It must run, not be refused as still waiting for its state; a
// Session kube-apiserver also says is waiting is still refused.
func TestARunJustAfterItsRestoreIsNotRefusedByALaggingCache(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	waiting := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "u1",
		Annotations: map[string]string{sandboxv1alpha1.AnnotationRestoring: "caller"}}}
	restored := waiting.DeepCopy()
	restored.Annotations = nil
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(waiting).Build()
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(restored).Build()

	s := &Server{Client: cache, APIReader: api}
	if refused := s.stillRestoring(ctx, SubExec, waiting); refused != "" {
		t.Fatalf("kube-apiserver says the restore is done; the run was refused: %s", refused)
	}
	s = &Server{Client: cache, APIReader: cache}
	if refused := s.stillRestoring(ctx, SubExec, waiting); !strings.Contains(refused, "waiting for its state") {
		t.Fatalf("a Session still waiting for its state must be refused, got %q", refused)
	}
	recreated := restored.DeepCopy()
	recreated.UID = "u2" // the name now belongs to another Session: the answer is not about this one
	s = &Server{Client: cache, APIReader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(recreated).Build()}
	if refused := s.stillRestoring(ctx, SubExec, waiting); refused == "" {
		t.Fatal("another Session under the same name must not lift this one's refusal")
	}
}

// A stream cut by a draining replica is not a caller that went away: the
// caller attaches again by run ID through another replica, so the run is not
// interrupted. Outside a drain, a cancelled stream is.
func TestADrainingReplicaDoesNotInterruptTheRunsItCuts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx)
	s := &Server{}
	s.draining.Store(true)
	s.callerGone(req, nil, "run", true) // a nil target: an interrupt would panic

	s.draining.Store(false)
	interrupted := func() (tried bool) {
		defer func() { tried = recover() != nil }()
		s.callerGone(req, nil, "run", true)
		return false
	}()
	if !interrupted {
		t.Fatal("outside a drain, the run of a caller that went away must be interrupted")
	}
}
