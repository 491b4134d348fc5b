package dataplane

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// Subresources of sessions in data.warmpool.dev, each its own RBAC verb.
const (
	SubExec       = "exec"       // POST: run code (create sessions/exec)
	SubInterrupt  = "interrupt"  // POST: interrupt a run (create sessions/interrupt)
	SubBridge     = "bridge"     // POST: answer a bridge call (create sessions/bridge)
	SubExecutions = "executions" // GET ?id=: a run's state or result (get sessions/executions)
	SubVariables  = "variables"  // GET ?name=: a global as JSON (get sessions/variables)
	SubFiles      = "files"      // GET ?path= (&list=true), PUT ?path= (get/update sessions/files)
	SubReset      = "reset"      // POST: a fresh interpreter (create sessions/reset)
	SubSnapshot   = "snapshot"   // GET: the interpreter's state as a snapshot (get sessions/snapshot)
	SubRestore    = "restore"    // POST: replace the state with a snapshot's (create sessions/restore)
	SubFork       = "fork"       // POST: copy the Session into new ones (create sessions/fork)
)

const (
	prefix = "/apis/" + Group + "/" + Version
	// maxRequestBytes bounds a request body other than a file write.
	maxRequestBytes = 4 << 20
	// interruptTimeout bounds the interrupt sent when a streaming caller goes away.
	interruptTimeout = 10 * time.Second
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	mux.HandleFunc("GET /livez", ok)
	mux.HandleFunc("GET /apis/"+Group, apiGroup)
	mux.HandleFunc("GET "+prefix, apiResources)
	at := func(sub string) string { return prefix + "/namespaces/{namespace}/sessions/{name}/" + sub }
	mux.HandleFunc("POST "+at(SubExec), s.session(SubExec, s.exec))
	mux.HandleFunc("POST "+at(SubInterrupt), s.session(SubInterrupt, s.interrupt))
	mux.HandleFunc("POST "+at(SubBridge), s.session(SubBridge, s.bridge))
	mux.HandleFunc("GET "+at(SubExecutions), s.session(SubExecutions, s.execution))
	mux.HandleFunc("GET "+at(SubVariables), s.session(SubVariables, s.variable))
	mux.HandleFunc("GET "+at(SubFiles), s.session(SubFiles, s.readFiles))
	mux.HandleFunc("PUT "+at(SubFiles), s.session(SubFiles, s.writeFile))
	mux.HandleFunc("POST "+at(SubReset), s.session(SubReset, s.reset))
	mux.HandleFunc("GET "+at(SubSnapshot), s.session(SubSnapshot, s.snapshotOf))
	mux.HandleFunc("POST "+at(SubRestore), s.session(SubRestore, s.restoreInto))
	mux.HandleFunc("POST "+at(SubFork), s.session(SubFork, s.fork))
	mux.HandleFunc("POST "+prefix+"/namespaces/{namespace}/"+ResourceRuns+"/{name}/"+SubExec, s.instrumented(ResourceRuns, s.run))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("no %s %s in %s/%s", r.Method, r.URL.Path, Group, Version))
	})
	return mux
}

func ok(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }

// target is what a request in a Session works with.
type target struct {
	ses   *sandboxv1alpha1.Session
	pool  *sandboxv1alpha1.SandboxPool
	pod   *corev1.Pod
	agent *agentgate.Agent
	// resumed: the Session was Suspended, and resumed for this request;
	// timing says how long that took (a Server-Timing entry).
	resumed bool
	timing  string
}

// session resolves the Session of the URL to its pod's agent, refusing a
// Session that is not Ready, and records the request's metrics.
func (s *Server) session(sub string, h func(http.ResponseWriter, *http.Request, *target)) http.HandlerFunc {
	return s.instrumented(sub, func(w http.ResponseWriter, r *http.Request) {
		t, code, reason, msg := s.resolve(r.Context(), r.PathValue("namespace"), r.PathValue("name"))
		if t == nil && code == http.StatusConflict && sub != SubInterrupt {
			t, code, reason, msg = s.resume(r, r.PathValue("namespace"), r.PathValue("name"), code, reason, msg)
		}
		if t == nil {
			writeStatus(w, code, reason, msg)
			return
		}
		if refused := ownerOnly(r, t.ses); refused != "" {
			writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, refused)
			return
		}
		if refused := s.stillRestoring(r.Context(), sub, t.ses); refused != "" {
			writeStatus(w, http.StatusConflict, metav1.StatusReasonConflict, refused)
			return
		}
		h(w, r, t)
	})
}

// instrumented records a request's metrics under sub, and answers 503 until
// this replica can sign its calls to agents.
func (s *Server) instrumented(sub string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		defer func() {
			metrics.DataPlaneRequests.WithLabelValues(sub, strconv.Itoa(rec.code)).Inc()
			metrics.DataPlaneDuration.WithLabelValues(sub).Observe(time.Since(start).Seconds())
		}()
		if s.KeysLoaded != nil && !s.KeysLoaded() {
			rec.Header().Set("Retry-After", "1")
			writeStatus(rec, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
				"this manager replica has not loaded the agent signing keys yet; retry in a moment")
			return
		}
		if sub == SubInterrupt || sub == SubBridge {
			h(rec, r) // no seat: see fairness.go
			return
		}
		s.seated(rec, r, h)
	}
}

// stillRestoring is restoring, asked again of kube-apiserver before a
// refusal: the restore that cleared the annotation may have been answered a
// moment ago, by this replica or another, and the cache not have heard yet.
func (s *Server) stillRestoring(ctx context.Context, sub string, ses *sandboxv1alpha1.Session) (refused string) {
	refused = restoring(sub, ses)
	if refused == "" || s.APIReader == nil {
		return refused
	}
	var fresh sandboxv1alpha1.Session
	if err := s.APIReader.Get(ctx, client.ObjectKeyFromObject(ses), &fresh); err != nil || fresh.UID != ses.UID {
		return refused
	}
	return restoring(sub, &fresh)
}

// cacheLag bounds how long a request waits for this replica's cache to show
// the lease its caller saw (the caller's watch and this informer hear of it
// apart) before it asks kube-apiserver.
const cacheLag = 100 * time.Millisecond

// behind reports whether a refusal read from the cache may be the cache
// lagging behind a lease: the Session not there yet, Pending, or its pod's
// claim not in yet.
func behind(code int, msg string) bool {
	return code == http.StatusNotFound || strings.HasSuffix(msg, podGone) ||
		(code == http.StatusConflict && strings.Contains(msg, " is "+string(sandboxv1alpha1.SessionPending)))
}

// resolveCached resolves from the cache, waiting up to cacheLag for the
// informer's events while the cache may be behind: a caller who just saw
// its Session Ready is served from the cache as soon as it hears, without
// reads of kube-apiserver or polling.
func (s *Server) resolveCached(ctx context.Context, ns, name string) (*target, int, metav1.StatusReason, string) {
	t, code, reason, msg := s.resolveWith(ctx, s.Client, ns, name)
	if t != nil || s.Informers == nil || !behind(code, msg) {
		return t, code, reason, msg // the usual case: no subscription on the way of a run
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	timeout := time.NewTimer(cmp.Or(s.cacheLag, cacheLag))
	defer timeout.Stop()
	for {
		// Subscribed before the cache is read again: an event between the two is not missed.
		changed := s.ready.subscribe(key)
		t, code, reason, msg = s.resolveWith(ctx, s.Client, ns, name)
		if t != nil || !behind(code, msg) {
			s.ready.unsubscribe(key, changed)
			return t, code, reason, msg
		}
		select {
		case <-changed:
			continue
		case <-timeout.C:
		case <-ctx.Done():
		}
		s.ready.unsubscribe(key, changed)
		return t, code, reason, msg
	}
}

func (s *Server) resolve(ctx context.Context, ns, name string) (*target, int, metav1.StatusReason, string) {
	t, code, reason, msg := s.resolveCached(ctx, ns, name)
	if t == nil && code == http.StatusConflict && strings.Contains(msg, " is "+string(sandboxv1alpha1.SessionSuspended)) {
		return nil, code, reason, msg // the cache is not behind: the caller's request resumes it (resume.go)
	}
	if t == nil && code != http.StatusInternalServerError && s.APIReader != nil {
		// The cache can lag behind what the caller saw (its Session just became Ready).
		t, code, reason, msg = s.resolveWith(ctx, s.APIReader, ns, name)
		// The claim of a Session's pod is written alongside its Ready
		// status, and can land a moment after it: wait for it, briefly
		// (and read once more after it landed between the two reads).
		for wait := 5 * time.Millisecond; t == nil && strings.HasSuffix(msg, podGone) && wait < time.Second; wait *= 2 {
			inFlight := s.claimInFlight(ctx, ns, name)
			if inFlight {
				select {
				case <-ctx.Done():
					return nil, http.StatusRequestTimeout, metav1.StatusReasonTimeout, "the request ended while the Session's claim was stored"
				case <-time.After(wait):
				}
			}
			t, code, reason, msg = s.resolveWith(ctx, s.APIReader, ns, name)
			if !inFlight {
				break
			}
		}
	}
	if t == nil {
		return nil, code, reason, msg
	}
	agent, err := s.Gate.Open(ctx, t.pool, t.pod, agentgate.ForSession(t.ses))
	if agentgate.IsRefused(err) {
		return nil, http.StatusConflict, metav1.StatusReasonConflict,
			fmt.Sprintf("Session %s's pod %s is gone (%v); the Session is being marked Lost: start a new Session", name, t.ses.Status.PodName, err)
	}
	if err != nil {
		return nil, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, fmt.Sprintf("reach pod %s: %v", t.pod.Name, err)
	}
	t.agent = agent
	return t, 0, "", ""
}

// podGone ends resolveWith's answer for a Ready Session whose pod does not
// carry its lease.
const podGone = " is gone; the Session is being marked Lost: start a new Session"

// claimInFlight reports whether a Ready Session's pod, as kube-apiserver has
// it, is the one its status names and is held by nobody yet: the lease's
// claim, written alongside the status, has not landed.
func (s *Server) claimInFlight(ctx context.Context, ns, name string) bool {
	ses := &sandboxv1alpha1.Session{}
	if err := s.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ses); err != nil ||
		ses.Status.Phase != sandboxv1alpha1.SessionReady || ses.Status.PodName == "" {
		return false
	}
	pod := &corev1.Pod{}
	if err := s.APIReader.Get(ctx, ses.PodKey(), pod); err != nil {
		return false
	}
	return pod.UID == ses.Status.PodUID && lease.Session(pod) == "" && lease.ClaimedBy(pod) == "" && !sandboxpod.IsTerminal(pod)
}

func (s *Server) resolveWith(ctx context.Context, r client.Reader, ns, name string) (*target, int, metav1.StatusReason, string) {
	ses := &sandboxv1alpha1.Session{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ses); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("Session %q not found in namespace %s", name, ns)
		}
		return nil, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error()
	}
	if ses.Status.Phase != sandboxv1alpha1.SessionReady || ses.Status.PodName == "" {
		why := ""
		for _, c := range ses.Status.Conditions {
			if c.Type == sandboxv1alpha1.SessionConditionReady && c.Reason != "" {
				why = fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
			}
		}
		phase := ses.Status.Phase
		if phase == "" {
			phase = sandboxv1alpha1.SessionPending
		}
		return nil, http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf("Session %s is %s%s: %s", name, phase, why, nextStep(phase))
	}
	pod := &corev1.Pod{}
	err := r.Get(ctx, ses.PodKey(), pod)
	// The pod under the name the Session's status gives must be the one it
	// holds, its pool's: anyone who may create pods can reuse a deleted
	// pod's name. The gate judges that (resolve); this is what the cache can
	// tell before it.
	gone := err != nil || !lease.HeldBy(pod, ses) || sandboxpod.IsTerminal(pod) || pod.UID != ses.Status.PodUID
	pool := &sandboxv1alpha1.SandboxPool{}
	if gone || r.Get(ctx, ses.PoolKey(), pool) != nil {
		return nil, http.StatusConflict, metav1.StatusReasonConflict,
			fmt.Sprintf("Session %s's pod %s%s", name, ses.Status.PodName, podGone)
	}
	return &target{ses: ses, pod: pod, pool: pool}, 0, "", ""
}

// ownerOnly refuses the caller a Session bound to its owner (spec.access
// Owner) unless the caller is that owner, whom admission recorded when the
// Session was created. RBAC already let the caller in: this is the binding
// on top, for every subresource, interrupt and file reads included.
func ownerOnly(r *http.Request, ses *sandboxv1alpha1.Session) (refused string) {
	if ses.Spec.Access != sandboxv1alpha1.SessionAccessOwner {
		return ""
	}
	caller := ""
	if u, ok := request.UserFrom(r.Context()); ok {
		caller = u.GetName()
	}
	if caller != "" && caller == ses.Spec.Owner {
		return ""
	}
	return fmt.Sprintf("Session %s serves its owner alone (spec.access Owner), and you are %q, not its owner", ses.Name, caller)
}

func nextStep(p sandboxv1alpha1.SessionPhase) string {
	if p == sandboxv1alpha1.SessionPending {
		return "wait until it is Ready (kubectl wait --for=jsonpath='{.status.phase}'=Ready session/NAME)"
	}
	return "its state is gone; create a new Session"
}

// exec runs code in the Session's interpreter, pinned to the interpreter the
// Session holds so that a replaced one (state gone) never runs it. A
// streaming caller that goes away before the result interrupts the run.
func (s *Server) exec(w http.ResponseWriter, r *http.Request, t *target) {
	var req sessions.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := s.Client.Get(r.Context(), t.ses.PoolKey(), pool); err != nil {
		pool = nil // the agent's own defaults and limits apply (it was started with the pool's)
	}
	if msg := checkExec(r, pool, &req); msg != "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, msg)
		return
	}
	s.runThroughSeal(w, r, t, pool, &req)
}

// runThroughSeal runs a checked run in the Session and answers the caller,
// also when the Session was being suspended under the run: its sandbox
// refused the run as sealed, the run did not start, and it runs once the
// Session is resumed on another pod.
func (s *Server) runThroughSeal(w http.ResponseWriter, r *http.Request, t *target, pool *sandboxv1alpha1.SandboxPool, req *sessions.ExecRequest) {
	if !s.runIn(w, r, t, pool, req) {
		return
	}
	if t = s.afterSeal(w, r, t); t != nil && !s.runIn(w, r, t, pool, req) {
		return
	}
	if t != nil {
		writeStatus(w, http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf(
			"Session %s was suspended twice under this run, which has not run: retry", t.ses.Name))
	}
}

// checkExec fills a run's defaults from its pool and refuses what the pool
// does not allow or the request cannot carry.
func checkExec(r *http.Request, pool *sandboxv1alpha1.SandboxPool, req *sessions.ExecRequest) (refused string) {
	if pool != nil {
		if msg := poolDefaults(pool, req); msg != "" {
			return msg
		}
	}
	req.Stream = req.Stream || acceptsNDJSON(r)
	if req.Bridge && !req.Stream {
		return "bridge needs a streamed exec (stream: true): bridge calls arrive as events"
	}
	return ""
}

// runIn sends a checked run to the Session's agent and relays its answer.
// The code's llm_query calls go to the caller when it answers them (bridge),
// else to the pool's ModelEndpoint, if the pool names one. sealed: the agent
// refused the run because a suspend sealed its pod, and nothing was written.
func (s *Server) runIn(w http.ResponseWriter, r *http.Request, t *target, pool *sandboxv1alpha1.SandboxPool, req *sessions.ExecRequest) (sealed bool) {
	runID := agentRunID(req.ID)
	stream := req.Stream
	var model func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer
	maxCalls := req.MaxBridgeCalls
	if !req.Bridge && pool != nil && s.Models != nil {
		var limit int
		if model, limit = s.Models.Bridge(r.Context(), pool); model != nil && limit > 0 && (maxCalls == 0 || maxCalls > limit) {
			maxCalls = limit
		}
	}
	body, _ := json.Marshal(protocol.ExecuteRequest{
		ID: runID, Code: req.Code, Language: req.Language, Context: req.Context, Env: req.Env, TimeoutMillis: req.TimeoutMillis,
		GraceMillis: req.GraceMillis, MaxOutputBytes: req.MaxOutputBytes, Stream: stream || model != nil, Bridge: req.Bridge || model != nil,
		MaxBridgeCalls: maxCalls, Interpreter: t.ses.Status.Interpreter, BridgeMethods: req.BridgeMethods, Resumed: t.resumed,
	})
	accept := "application/json"
	if stream || model != nil {
		accept = protocol.ContentTypeNDJSON
	}
	resp, err := s.send(r.Context(), t, body, accept, time.Duration(req.TimeoutMillis)*time.Millisecond)
	if err != nil {
		s.callerGone(r, t, runID, stream)
		agentFailed(w, err)
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusConflict && isSealed(resp) {
		return true
	}
	w.Header().Set("X-Warmpool-Run-Id", req.ID)
	if t.resumed {
		w.Header().Set("X-Warmpool-Resumed", "true")
		w.Header().Set("Server-Timing", t.timing)
	}
	if resp.StatusCode >= 300 || (!stream && model == nil) {
		relay(w, resp)
		return false
	}
	if stream {
		w.Header().Set("Content-Type", protocol.ContentTypeNDJSON)
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
	}
	flusher, _ := w.(http.Flusher)
	if stream && flusher != nil { // the caller learns the run's ID before the code prints anything
		flusher.Flush()
	}
	var answering *modelCalls // only a run whose pool's model answers its calls has any
	if model != nil {
		answering = newModelCalls(t, runID, model)
		defer answering.wait()
	}
	// Relayed as read, without a bound on a line: the agent bounds what a run
	// prints, and a line cut here would end the caller's stream mid-event.
	// A line the model answers, or any line but the result for a caller who
	// did not ask for a stream, is read whole instead (the agent bounds it).
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	lineStart, kind := true, lineOther
	var whole []byte
	for {
		frag, err := br.ReadSlice('\n')
		if lineStart && len(frag) > 0 {
			kind = classify(frag)
		}
		keep := kind == lineBridge && model != nil || !stream && kind == lineResult
		switch {
		case keep:
			whole = append(whole, frag...)
		case stream && len(frag) > 0:
			if _, werr := w.Write(frag); werr != nil {
				s.callerGone(r, t, runID, true)
				return false
			}
		}
		lineStart = err == nil
		if lineStart {
			switch {
			case keep && kind == lineBridge:
				answering.answer(r.Context(), whole)
			case keep: // the result of a run whose events the caller did not ask for
				var ev protocol.Event
				if jerr := json.Unmarshal(whole, &ev); jerr != nil || ev.Result == nil {
					agentFailed(w, fmt.Errorf("the agent's result did not parse: %v", jerr))
					return false
				}
				writeJSON(w, http.StatusOK, ev.Result)
				return false
			case stream && flusher != nil:
				flusher.Flush()
			}
			whole = whole[:0]
			if kind == lineResult {
				return false
			}
			continue
		}
		if err != bufio.ErrBufferFull {
			break // the agent's stream ended without a result (its pod went away): so does the caller's
		}
	}
	if !stream {
		agentFailed(w, errors.New("the agent's stream ended without a result (its pod went away?)"))
	}
	s.callerGone(r, t, runID, stream)
	return false
}

// agentRunID is the agent's ID of a data-plane run. The prefix keeps callers
// to their own runs: an ID they choose can never name an Execution's run on
// the same agent (those are Execution UIDs), to attach to it or interrupt it.
func agentRunID(id string) string { return "dp-" + id }

// poolDefaults fills what the caller left unset from the pool's
// executionDefaults, as for an Execution of that pool.
func poolDefaults(pool *sandboxv1alpha1.SandboxPool, req *sessions.ExecRequest) (refused string) {
	d := pool.Spec.ExecutionDefaults
	// What the pool allows is a ceiling, not a default a caller may exceed.
	if limit := sandboxpod.MaxTimeout(pool); time.Duration(req.TimeoutMillis)*time.Millisecond > limit {
		return fmt.Sprintf("timeoutMillis %d is longer than pool %s allows (spec.executionDefaults.maxTimeout %s)",
			req.TimeoutMillis, pool.Name, limit)
	}
	if d.MaxOutputBytes > 0 && req.MaxOutputBytes > int(d.MaxOutputBytes) {
		return fmt.Sprintf("maxOutputBytes %d is more than pool %s keeps (spec.executionDefaults.maxOutputBytes %d)",
			req.MaxOutputBytes, pool.Name, d.MaxOutputBytes)
	}
	if req.TimeoutMillis == 0 && d.Timeout != nil {
		req.TimeoutMillis = d.Timeout.Milliseconds()
	}
	if req.GraceMillis == 0 && d.InterruptGracePeriod != nil {
		req.GraceMillis = max(d.InterruptGracePeriod.Milliseconds(), 1)
	}
	if req.MaxOutputBytes == 0 && d.MaxOutputBytes > 0 {
		req.MaxOutputBytes = int(d.MaxOutputBytes)
	}
	return ""
}

// busyWait bounds the wait between two sends of a run the agent refused
// because the Session's interpreter was busy.
const busyWait = 250 * time.Millisecond

// send sends a run to the agent. While the Session's interpreter runs
// another run (an Execution that names the Session, or another caller's run)
// the agent refuses it with 409 and keeps nothing of it: the run is sent
// again, so it queues behind the other, for at most its own timeout (30 s
// when it has none); then the 409 goes to the caller.
func (s *Server) send(ctx context.Context, t *target, body []byte, accept string, timeout time.Duration) (*http.Response, error) {
	if timeout <= 0 {
		timeout = protocol.DefaultTimeout
	}
	giveUp := time.Now().Add(timeout)
	wait := 25 * time.Millisecond
	for {
		resp, err := t.agent.Raw(ctx, http.MethodPost, protocol.PathExecute, bytes.NewReader(body), "application/json", accept)
		// A sealed sandbox stays sealed: its Session moves to another pod,
		// which the caller waits for (afterSeal) instead of this one.
		if err != nil || resp.StatusCode != http.StatusConflict || isSealed(resp) || time.Now().Add(wait).After(giveUp) {
			return resp, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, busyWait)
	}
}

// callerGone interrupts a streamed run whose caller went away: nobody is left
// to read its output or answer its bridge calls. A blocking run goes on (its
// caller can ask for the result by ID); the server-side timeout bounds both.
// A draining replica cut the stream itself: its caller attaches again by run
// ID through another replica, and the run must still be going then (the
// upgrade e2e spec's 25 s step was interrupted by the replica it outlasted).
func (s *Server) callerGone(r *http.Request, t *target, id string, stream bool) {
	if !stream || r.Context().Err() == nil || s.draining.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), interruptTimeout)
	defer cancel()
	if err := t.agent.Interrupt(ctx, id); err != nil && !agentgate.IsStatus(err, http.StatusNotFound) && !agentgate.IsStatus(err, http.StatusConflict) {
		s.Log.Info("could not interrupt the run of a caller that went away", "session", t.ses.Name, "run", id, "err", err.Error())
	}
}

func (s *Server) interrupt(w http.ResponseWriter, r *http.Request, t *target) {
	var ref sessions.RunRef
	if !decode(w, r, &ref) || !required(w, "id", ref.ID) {
		return
	}
	s.forward(w, r, t, http.MethodPost, "/v1/executions/"+url.PathEscape(agentRunID(ref.ID))+"/interrupt", nil, "")
}

func (s *Server) bridge(w http.ResponseWriter, r *http.Request, t *target) {
	var a sessions.BridgeAnswer
	if !decode(w, r, &a) || !required(w, "id", a.ID) || !required(w, "call", a.Call) {
		return
	}
	body, _ := json.Marshal(protocol.BridgeAnswer{Result: a.Result, Error: a.Error})
	s.forward(w, r, t, http.MethodPost, "/v1/executions/"+url.PathEscape(agentRunID(a.ID))+"/bridge/"+url.PathEscape(a.Call), bytes.NewReader(body), "application/json")
}

func (s *Server) execution(w http.ResponseWriter, r *http.Request, t *target) {
	id := r.URL.Query().Get("id")
	if !required(w, "id", id) {
		return
	}
	s.forward(w, r, t, http.MethodGet, "/v1/executions/"+url.PathEscape(agentRunID(id)), nil, "")
}

func (s *Server) variable(w http.ResponseWriter, r *http.Request, t *target) {
	name := r.URL.Query().Get("name")
	if !required(w, "name", name) {
		return
	}
	s.forward(w, r, t, http.MethodGet, "/v1/variables/"+url.PathEscape(name), nil, "")
}

func (s *Server) readFiles(w http.ResponseWriter, r *http.Request, t *target) {
	q := url.Values{"path": {r.URL.Query().Get("path")}}
	path := protocol.PathFileRead
	if r.URL.Query().Get("list") == "true" {
		path = protocol.PathFileList
	}
	s.forward(w, r, t, http.MethodGet, path+"?"+q.Encode(), nil, "")
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, t *target) {
	q := url.Values{"path": {r.URL.Query().Get("path")}}
	if !required(w, "path", q.Get("path")) {
		return
	}
	s.forward(w, r, t, http.MethodPut, protocol.PathFileWrite+"?"+q.Encode(), r.Body, "application/octet-stream")
}

// reset replaces the Session's interpreter. The Session's interpreter is
// cleared before (so the Session's own check does not take the new one for
// a crash) and set to the new one after.
func (s *Server) reset(w http.ResponseWriter, r *http.Request, t *target) {
	if h, err := t.agent.Ready(r.Context()); err == nil && h.Busy > 0 {
		writeStatus(w, http.StatusConflict, metav1.StatusReasonConflict, "a run is under way in Session "+t.ses.Name+": interrupt it first")
		return
	}
	if err := s.setInterpreter(r.Context(), t.ses, t.ses.Status.Interpreter, ""); err != nil {
		writeStatus(w, http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf("record the reset of Session %s: %v", t.ses.Name, err))
		return
	}
	// From here the Session's record must be put right whatever the caller does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	resetErr := t.agent.Reset(ctx)
	h, err := t.agent.Ready(ctx)
	if err != nil {
		agentFailed(w, err) // the Session's check finds out what became of the pod
		return
	}
	if err := s.setInterpreter(ctx, t.ses, "", h.Interpreter); err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("record the new interpreter of Session %s: %v", t.ses.Name, err))
		return
	}
	if resetErr != nil {
		agentFailed(w, resetErr)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"interpreter": h.Interpreter})
}

// setInterpreter records the Session's interpreter, from what it was to
// what it is now. The resourceVersion in the patch makes two overlapping
// resets fail one of them instead of leaving the older tag behind; a
// conflict with any other write (the Session's activity, written every few
// seconds) is retried on a fresh read, as long as the Session still holds
// the same pod and the tag it had.
func (s *Server) setInterpreter(ctx context.Context, ses *sandboxv1alpha1.Session, from, to string) error {
	cur := ses.DeepCopy()
	for attempt := 0; ; attempt++ {
		patch, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": cur.ResourceVersion},
			"status":   map[string]any{"interpreter": to}})
		err := s.Client.Status().Patch(ctx, cur, client.RawPatch(types.MergePatchType, patch))
		if err == nil {
			*ses = *cur // the next write starts from this one
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 4 {
			return err
		}
		fresh := &sandboxv1alpha1.Session{}
		reader := s.APIReader
		if reader == nil {
			reader = s.Client
		}
		if gerr := reader.Get(ctx, client.ObjectKeyFromObject(ses), fresh); gerr != nil {
			return gerr
		}
		if fresh.UID != ses.UID || fresh.Status.Phase != sandboxv1alpha1.SessionReady ||
			fresh.Status.PodName != ses.Status.PodName || fresh.Status.Interpreter != from {
			return err // another reset, or the Session ended: theirs stands
		}
		cur = fresh
	}
}

// forward passes one request to the Session's agent and its answer back.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, t *target, method, path string, body io.Reader, contentType string) {
	resp, err := t.agent.Raw(r.Context(), method, path, body, contentType, "")
	if err != nil {
		agentFailed(w, err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	relay(w, resp)
}

// relay copies an agent's answer. The agent refusing our own token is a
// server fault (502), not the caller's.
func relay(w http.ResponseWriter, resp *http.Response) {
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		writeStatus(w, http.StatusBadGateway, metav1.StatusReasonInternalError, "the sandbox agent refused the data plane's token (the agent keys may be rotating): retry")
		return
	}
	if resp.StatusCode >= 400 {
		// The agent's {"error": ...} becomes the metav1.Status every
		// Kubernetes client reads, with the agent's code.
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var body protocol.ErrorBody
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &body) == nil && body.Error != "" {
			msg = body.Error
		}
		writeStatus(w, resp.StatusCode, reasonFor(resp.StatusCode), "sandbox agent: "+msg)
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// reasonFor is the metav1.StatusReason Kubernetes gives an HTTP code.
func reasonFor(code int) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusGone:
		return metav1.StatusReasonGone
	case http.StatusRequestEntityTooLarge:
		return metav1.StatusReasonRequestEntityTooLarge
	case http.StatusUnsupportedMediaType:
		return metav1.StatusReasonUnsupportedMediaType
	case http.StatusUnprocessableEntity:
		return metav1.StatusReasonInvalid
	case http.StatusTooManyRequests:
		return metav1.StatusReasonTooManyRequests
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusGatewayTimeout:
		return metav1.StatusReasonTimeout
	}
	if code >= 500 {
		return metav1.StatusReasonInternalError
	}
	return metav1.StatusReasonUnknown
}

func agentFailed(w http.ResponseWriter, err error) {
	var ae *agentgate.APIError
	if errors.As(err, &ae) && ae.Code != http.StatusUnauthorized && ae.Code != http.StatusForbidden {
		writeStatus(w, ae.Code, reasonFor(ae.Code), "sandbox agent: "+ae.Message)
		return
	}
	writeStatus(w, http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "call the sandbox agent: "+err.Error())
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge,
				fmt.Sprintf("request body: larger than %d bytes (send large inputs as files: sessions/files)", tooLarge.Limit))
			return false
		}
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}

func required(w http.ResponseWriter, field, v string) bool {
	if v == "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, field+" is required")
		return false
	}
	return true
}

func acceptsNDJSON(r *http.Request) bool {
	return bytes.Contains([]byte(r.Header.Get("Accept")), []byte(protocol.ContentTypeNDJSON))
}

// writeStatus answers with a metav1.Status, as Kubernetes APIs do: kubectl
// and client-go show its message.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	writeJSON(w, code, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type statusRecorder struct {
	http.ResponseWriter
	code    int
	written int64 // bytes of the body written
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	n, err := s.ResponseWriter.Write(p)
	s.written += int64(n)
	return n, err
}

func (s *statusRecorder) WriteHeader(code int) { s.code = code; s.ResponseWriter.WriteHeader(code) }
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
