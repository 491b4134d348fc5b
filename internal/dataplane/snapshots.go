package dataplane

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/membudget"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Snapshots through the data plane. The bytes are the agent's
// (pkg/snapshot): this server reads their JSON manifest and never their
// pickle, which only an interpreter in a sandbox loads.
const (
	// maxForkBytes bounds the snapshot a fork holds in this server's memory
	// while it restores it into each fork (the data plane's memory limit is
	// 256 MiB; a 100 MB snapshot got it OOM-killed): a larger Session is
	// copied by its caller, snapshot then restore, which stream.
	maxForkBytes = 64 << 20
	// maxForks bounds the forks of one request.
	maxForks = 16
	// defaultForkWait bounds the wait for the forks' pods: under the API
	// server's 60 s timeout of a request that is not long-running.
	defaultForkWait = 50 * time.Second
	// forkFinishTimeout bounds the fork's work after the caller went away:
	// forks half made are finished or closed, never left waiting.
	forkFinishTimeout = 2 * time.Minute
)

// snapshotOf streams a snapshot of the Session's interpreter (and, with
// ?workspace=true, its files) to the caller: get sessions/snapshot.
func (s *Server) snapshotOf(w http.ResponseWriter, r *http.Request, t *target) {
	q := url.Values{}
	for _, k := range []string{protocol.QueryWorkspace, protocol.QueryMaxBytes} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	path := protocol.PathSnapshot
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := t.agent.Raw(r.Context(), http.MethodPost, path, nil, "", snapshot.MediaType)
	if err != nil {
		agentFailed(w, err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusOK && resp.ContentLength >= 0 {
		w.Header().Set("Content-Length", fmt.Sprint(resp.ContentLength))
	}
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s.wpsnap"`, t.ses.Name))
	relay(w, resp)
}

// restoreInto replaces the Session's state with the caller's snapshot
// (create sessions/restore), and clears the Session's restoring annotation,
// after which its runs may start.
func (s *Server) restoreInto(w http.ResponseWriter, r *http.Request, t *target) {
	res, err := t.agent.Restore(r.Context(), r.Body, agentgate.RestoreOptions{})
	if err != nil {
		agentFailed(w, err)
		return
	}
	if err := s.restored(r.Context(), t.ses); err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("the state is restored, but clearing Session %s's %s annotation failed: %v; restore again", t.ses.Name,
				sandboxv1alpha1.AnnotationRestoring, err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// restored lets runs into a Session that waited for its state.
func (s *Server) restored(ctx context.Context, ses *sandboxv1alpha1.Session) error {
	if _, ok := ses.Annotations[sandboxv1alpha1.AnnotationRestoring]; !ok {
		return nil
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, sandboxv1alpha1.AnnotationRestoring)
	return s.Client.Patch(ctx, ses, client.RawPatch(types.MergePatchType, patch))
}

// fork copies the Session into new Sessions (create sessions/fork): one
// snapshot, taken before any fork exists (a namespace too large or a busy
// Session fails the request at once), restored into each fork as soon as it
// is Ready. A fork is made with the restoring annotation, which only a
// complete restore clears: one whose copy failed is closed, and runs in it
// are refused meanwhile, so it never passes for a copy.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, t *target) {
	var req sessions.ForkRequest
	if !decode(w, r, &req) {
		return
	}
	names, msg := forkNames(t.ses.Name, &req)
	if msg != "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, msg)
		return
	}
	caller, ok := request.UserFrom(r.Context())
	if !ok || caller.GetName() == "" {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, "no authenticated user on the request")
		return
	}
	if refused := s.may(r.Context(), authorizer.AttributesRecord{User: caller, Verb: "create", Namespace: t.ses.Namespace,
		APIGroup: sandboxv1alpha1.GroupVersion.Group, APIVersion: sandboxv1alpha1.GroupVersion.Version, Resource: "sessions",
		ResourceRequest: true}, "which forking makes"); refused != "" {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, refused)
		return
	}
	wait := defaultForkWait
	if req.WaitMillis > 0 {
		wait = min(time.Duration(req.WaitMillis)*time.Millisecond, maxRunWait)
	}
	// One fork of a Session at a time in a replica: the agent takes one
	// snapshot at a time, and a second would hold another copy of the
	// same state here.
	if _, busy := s.forking.LoadOrStore(t.ses.UID, struct{}{}); busy {
		tooMany(w, membudget.RetryAfter, fmt.Sprintf("a fork of Session %s is under way in this data-plane replica; nothing was made", t.ses.Name))
		return
	}
	defer s.forking.Delete(t.ses.UID)
	// The snapshot is held in this replica's memory until every fork has it:
	// taken from its budget as it is read, refused (429) before any fork exists.
	hold, err := s.Memory.Acquire("fork", t.ses.Namespace, 0)
	if err != nil {
		tooMany(w, membudget.RetryAfter, err.Error()+"; nothing was made")
		return
	}
	defer hold.Release()
	snap, m, err := s.takeSnapshot(r.Context(), t, req.Workspace, hold)
	switch {
	case membudget.IsFull(err):
		tooMany(w, membudget.RetryAfter, err.Error()+"; nothing was made")
		return
	case err != nil:
		agentFailed(w, err)
		return
	}
	// From here the forks must end restored or closed, whatever the caller does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), wait+forkFinishTimeout)
	defer cancel()
	forks := make([]*sandboxv1alpha1.Session, 0, len(names))
	for _, name := range names {
		f := forkOf(t.ses, name, caller.GetName())
		if err := s.Client.Create(ctx, f); err != nil {
			s.closeAll(ctx, forks)
			code := http.StatusInternalServerError
			if ae, ok := err.(errors.APIStatus); ok {
				code = int(ae.Status().Code)
			}
			writeStatus(w, code, metav1.StatusReason(errors.ReasonForError(err)), fmt.Sprintf("create fork %s: %v", name, err))
			return
		}
		forks = append(forks, f)
	}
	errs := make([]string, len(forks))
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.restoreFork(ctx, f, snap, wait); err != nil {
				errs[i] = fmt.Sprintf("%s: %v", f.Name, err)
			}
		}()
	}
	wg.Wait()
	var failed []string
	for i, e := range errs {
		if e != "" {
			failed = append(failed, e)
			s.closeSession(ctx, forks[i])
		}
	}
	if len(failed) > 0 {
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, fmt.Sprintf(
			"%d of %d forks failed and were closed (%s)", len(failed), len(forks), strings.Join(failed, "; ")))
		return
	}
	writeJSON(w, http.StatusOK, sessions.ForkResponse{Sessions: names, Manifest: m})
}

// takeSnapshot reads a snapshot of the Session into memory, within
// maxForkBytes and what hold can take.
func (s *Server) takeSnapshot(ctx context.Context, t *target, workspace bool, hold *membudget.Hold) (membudget.Chunks, *snapshot.Manifest, error) {
	body, _, err := t.agent.Snapshot(ctx, agentgate.SnapshotOptions{Workspace: workspace, MaxBytes: maxForkBytes})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = body.Close() }()
	snap, err := hold.ReadAll(body, snapshot.MaxSize(maxForkBytes))
	if err != nil {
		return nil, nil, fmt.Errorf("read the snapshot of Session %s: %w", t.ses.Name, err)
	}
	m, err := snapshot.ReadHeader(snap.Reader())
	if err != nil {
		return nil, nil, fmt.Errorf("the snapshot of Session %s: %w", t.ses.Name, err)
	}
	return snap, m, nil
}

// tooMany answers 429: the replica will not take this now, and when to
// try again (whole seconds, as Retry-After has them).
func tooMany(w http.ResponseWriter, retryAfter time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retryAfter.Seconds()))))
	writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg)
}

func (s *Server) restoreFork(ctx context.Context, f *sandboxv1alpha1.Session, snap membudget.Chunks, wait time.Duration) error {
	ready, _, _, msg := s.waitReady(ctx, f, wait, "")
	if ready == nil {
		return fmt.Errorf("%s", msg)
	}
	ft, _, _, msg := s.resolve(ctx, f.Namespace, f.Name)
	if ft == nil {
		return fmt.Errorf("%s", msg)
	}
	if _, err := ft.agent.Restore(ctx, snap.Reader(), agentgate.RestoreOptions{}); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return s.restored(ctx, ft.ses)
}

func (s *Server) closeAll(ctx context.Context, list []*sandboxv1alpha1.Session) {
	for _, ses := range list {
		s.closeSession(ctx, ses)
	}
}

// forkNames checks or makes up the forks' names.
func forkNames(src string, req *sessions.ForkRequest) ([]string, string) {
	names := req.Names
	switch {
	case len(names) > 0 && req.Count > 0 && req.Count != len(names):
		return nil, fmt.Sprintf("count %d and %d names disagree: give one or the other", req.Count, len(names))
	case len(names) == 0 && (req.Count < 1 || req.Count > maxForks):
		return nil, fmt.Sprintf("count must be 1-%d", maxForks)
	case len(names) > maxForks:
		return nil, fmt.Sprintf("at most %d forks at once", maxForks)
	}
	if len(names) == 0 {
		base := src
		if len(base) > 45 {
			base = base[:45]
		}
		for range req.Count {
			names = append(names, strings.TrimRight(base, "-")+"-fork-"+utilrand.String(5))
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, fmt.Sprintf("fork name %q: %s", n, strings.Join(errs, "; "))
		}
		if seen[n] {
			return nil, fmt.Sprintf("fork name %q given twice", n)
		}
		seen[n] = true
	}
	return names, ""
}

// forkOf is a new Session like src, owned by the caller, waiting for src's state.
func forkOf(src *sandboxv1alpha1.Session, name, owner string) *sandboxv1alpha1.Session {
	spec := *src.Spec.DeepCopy()
	spec.Owner, spec.Close = owner, false
	return &sandboxv1alpha1.Session{
		ObjectMeta: metav1.ObjectMeta{Namespace: src.Namespace, Name: name, Annotations: map[string]string{
			sandboxv1alpha1.AnnotationRestoring: src.Name, sandboxv1alpha1.AnnotationForkedFrom: src.Name}},
		Spec: spec,
	}
}

// may asks the authorizer whether the caller may do a, beyond the request's
// own verb; why says what needs it.
func (s *Server) may(ctx context.Context, a authorizer.AttributesRecord, why string) (refused string) {
	if s.authorizer == nil {
		return "this data plane has no authorizer to check the caller's rights with"
	}
	decision, reason, err := s.authorizer.Authorize(ctx, a)
	if decision == authorizer.DecisionAllow {
		return ""
	}
	what := a.Resource + "." + a.APIGroup
	if a.Subresource != "" {
		what = a.Resource + "/" + a.Subresource + " in " + a.APIGroup
	}
	msg := fmt.Sprintf("user %q may not %s %s in namespace %s, %s", a.User.GetName(), a.Verb, what, a.Namespace, why)
	if reason != "" {
		msg += ": " + reason
	}
	if err != nil {
		msg += " (" + err.Error() + ")"
	}
	return msg
}

// restoring refuses work in a Session that waits for its state.
func restoring(sub string, ses *sandboxv1alpha1.Session) (refused string) {
	from, ok := ses.Annotations[sandboxv1alpha1.AnnotationRestoring]
	if !ok || sub == SubRestore || sub == SubInterrupt {
		return ""
	}
	what := "its state (a restore: POST sessions/" + ses.Name + "/restore with a snapshot)"
	if ses.Annotations[sandboxv1alpha1.AnnotationForkedFrom] != "" {
		what = "its copy of Session " + from + " (a fork); a fork whose copy failed is closed: fork again"
	}
	return fmt.Sprintf("Session %s is waiting for %s; nothing runs in it until then", ses.Name, what)
}
