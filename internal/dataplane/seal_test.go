package dataplane

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// A run that a sealed sandbox refuses (its Session was being suspended under
// it) is not sent to that sandbox again, and the caller is told what became
// of it: here the Session ended instead of moving, so the answer is a 409
// that says the code has not run. The one-call run and sessions/exec share
// this path; the one-call run used to answer 200 with an empty body, and
// both used to send the run again until its timeout.
func TestARunASealedSandboxRefusesIsAnsweredAndNotSentAgain(t *testing.T) {
	var sends atomic.Int32
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != protocol.PathExecute {
			http.NotFound(w, r)
			return
		}
		sends.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(protocol.ErrorBody{Error: "sealed", Reason: protocol.ReasonSealed})
	}))
	defer agent.Close()

	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "run-1", UID: "u1"},
		Status: sandboxv1alpha1.SessionStatus{Phase: sandboxv1alpha1.SessionClosed, PodName: "p"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ses).WithStatusSubresource(ses).Build()
	s := &Server{Client: c, APIReader: c}
	ready := ses.DeepCopy()
	ready.Status.Phase = sandboxv1alpha1.SessionReady
	tg := &target{ses: ready, pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pools", Name: "p"}},
		agent: agentclient.New(agent.URL, "token")}

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/apis/data.warmpool.dev/v1alpha1/namespaces/ns/runs/run-1/exec", nil)
	s.runThroughSeal(rec, req, tg, nil, &sessions.ExecRequest{ID: "r1", Code: "print(1)", TimeoutMillis: 5000})

	if n := sends.Load(); n != 1 {
		t.Errorf("the run was sent to the sealed sandbox %d times, want once", n)
	}
	var st metav1.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusConflict ||
		!strings.Contains(st.Message, "the code has not run") || !strings.Contains(st.Message, "Closed") {
		t.Fatalf("want 409 saying the Session ended and the code has not run, got %d %q", rec.Code, rec.Body.String())
	}
}
