package dataplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// A Suspended Session resumes on its next request: the data plane asks the
// Session controller (AnnotationResume; the lease stays the controller's),
// waits for the Ready status in its cache, and serves the request on the
// new pod. A run the agent refused because a suspend sealed its pod under
// it never started: it waits for the same resume and runs once.

// resumeWait bounds the wait for a resume: under the API server's 60 s
// timeout of a request that is not long-running.
const resumeWait = 50 * time.Second

// resume serves a request to a Session that is not Ready: a Suspended one
// (or one resuming) is resumed and resolved again; any other keeps the
// refusal it had (code, reason, msg).
func (s *Server) resume(r *http.Request, ns, name string, code int, reason metav1.StatusReason, msg string) (*target, int, metav1.StatusReason, string) {
	ses := &sandboxv1alpha1.Session{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := s.Client.Get(r.Context(), key, ses); err != nil {
		return nil, code, reason, msg
	}
	if ses.Status.Snapshot == nil || (ses.Status.Phase != sandboxv1alpha1.SessionSuspended && ses.Status.Phase != sandboxv1alpha1.SessionPending) {
		return nil, code, reason, msg
	}
	// Only a caller who may use the Session wakes it.
	if refused := ownerOnly(r, ses); refused != "" {
		return nil, http.StatusForbidden, metav1.StatusReasonForbidden, refused
	}
	return s.resumed(r, ses, "")
}

// resumed waits for ses to be Ready on a pod other than leaving, asking
// for its resume when it is Suspended, and resolves it.
func (s *Server) resumed(r *http.Request, ses *sandboxv1alpha1.Session, leaving string) (*target, int, metav1.StatusReason, string) {
	start := time.Now()
	ready, code, reason, msg := s.waitReady(r.Context(), ses, resumeWait, leaving)
	if ready == nil {
		return nil, code, reason, fmt.Sprintf("resuming Session %s: %s", ses.Name, msg)
	}
	t, code, reason, msg := s.resolve(r.Context(), ses.Namespace, ses.Name)
	if t != nil {
		t.resumed = true
		resume := time.Since(start)
		metrics.DataPlaneResume.Observe(resume.Seconds())
		// Where the time before the run went, for a caller's timeline.
		t.timing = fmt.Sprintf("resume;dur=%.1f", ms(resume))
	}
	return t, code, reason, msg
}

// afterSeal waits, for a run a sealed pod refused, until the Session is
// resumed elsewhere; nil when it is not (the answer is written).
func (s *Server) afterSeal(w http.ResponseWriter, r *http.Request, t *target) *target {
	nt, code, reason, msg := s.resumed(r, t.ses, t.pod.Name)
	if nt == nil {
		writeStatus(w, code, reason, msg+"; the code has not run")
	}
	return nt
}

// isSealed reads a refusal of the agent: a seal, or anything else, whose
// body is put back for relay.
func isSealed(resp *http.Response) bool {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = io.NopCloser(bytes.NewReader(data))
	var body protocol.ErrorBody
	return json.Unmarshal(data, &body) == nil && body.Reason == protocol.ReasonSealed
}
