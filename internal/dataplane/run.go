package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/tenancy"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// ResourceRuns is the data plane's one-call run: POST
// .../namespaces/NS/runs/NAME/exec creates Session NAME, waits until it is
// Ready and runs the first code in it, so that a caller with nothing gets its
// first answer in one round trip (create "runs/exec" in data.warmpool.dev, on
// top of creating Sessions and sessions/exec, which the handler checks as the
// caller).
//
// Why a subresource named exec, and the Session's name in the path:
// kube-apiserver ends a request that is not long-running after its request
// timeout (60 s by default), and only watches, proxies and the subresources
// exec, attach, log and portforward are long-running. A run's wait for a pod
// of a busy pool and its code can both take longer. The caller names the
// Session, so it can ask about the run whatever becomes of the answer.
//
// The Session is created by the data plane, on the caller's behalf: the
// caller is its spec.owner, which the warmpool-owner admission policy lets
// only a user with the "delegate" verb on sessions set to someone else.
// kube-apiserver's audit log has the caller's request to runs; the Session's
// create is the data plane's. The lease stays the Session controller's
// alone: the data plane waits for its Ready status, event-driven, in its own
// cache, instead of the caller waiting on a watch.
const ResourceRuns = "runs"

const (
	// defaultRunWait bounds the wait for a warm interpreter; maxRunWait is
	// the most a caller may ask for (each wait holds a request open).
	defaultRunWait = 5 * time.Minute
	maxRunWait     = time.Hour
	// oneCallIdleTimeout is a one-call Session's idle timeout when the
	// caller keeps none: the close the data plane sends as the response
	// ends is what frees the pod, this only if that close never comes.
	oneCallIdleTimeout = time.Minute
	// closeTimeout bounds the close of a one-call Session.
	closeTimeout = 10 * time.Second
)

func (s *Server) run(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	var req sessions.RunRequest
	if !decode(w, r, &req) || !required(w, "pool", req.Pool) {
		return
	}
	if req.WaitMillis < 0 || time.Duration(req.WaitMillis)*time.Millisecond > maxRunWait {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("waitMillis %d is outside 0 (the default, %s) to %s", req.WaitMillis, defaultRunWait, maxRunWait))
		return
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("Session name %q: %v", name, errs))
		return
	}
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	caller, ok := request.UserFrom(r.Context())
	if !ok || caller.GetName() == "" {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, "no authenticated user on the request")
		return
	}
	if refused := s.mayCreateAndRun(r.Context(), caller, ns); refused != "" {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, refused)
		return
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	ref := sandboxv1alpha1.ParsePoolReference(req.Pool)
	if err := s.Client.Get(r.Context(), ref.Key(ns), pool); err != nil {
		if apierrors.IsNotFound(err) {
			writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("SandboxPool %q not found in namespace %s", ref.Name, ref.Key(ns).Namespace))
			return
		}
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		return
	}
	if err := s.Tenancy.Admit(r.Context(), pool, ns); err != nil {
		var refused *tenancy.Refusal
		if errors.As(err, &refused) {
			writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, refused.Message)
			return
		}
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		return
	}
	if msg := checkExec(r, pool, &req.ExecRequest); msg != "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, msg)
		return
	}

	start := time.Now()
	ses := oneCallSession(ns, name, caller.GetName(), &req)
	claimed, err := s.createRun(r.Context(), ses, pool, req.Keep)
	created := time.Now()
	if err != nil {
		code := http.StatusInternalServerError
		if ae, ok := err.(apierrors.APIStatus); ok {
			code = int(ae.Status().Code)
		}
		writeStatus(w, code, metav1.StatusReason(apierrors.ReasonForError(err)), "create the run's Session: "+err.Error())
		return
	}
	// The Session ends with the request: its pod goes back to its pool now,
	// not after an idle timeout. Unless the caller went away once the code
	// was sent: then the Session keeps the run's outcome for the caller to
	// ask about (sessions/executions), until the caller closes it or its
	// idle timeout does.
	closeIt := true // until the code is sent, whatever Keep says: a Session whose run failed is nobody's
	defer func() {
		if closeIt {
			s.closeSession(r.Context(), ses)
		}
	}()
	t := claimed
	if t == nil {
		wait := defaultRunWait
		if req.WaitMillis > 0 {
			wait = time.Duration(req.WaitMillis) * time.Millisecond
		}
		readySes, code, reason, msg := s.waitReady(r.Context(), ses, wait, "")
		if readySes == nil {
			writeStatus(w, code, reason, msg+"; the code has not run")
			return
		}
		ready := time.Now()
		metrics.DataPlaneRunLease.Observe(ready.Sub(start).Seconds())
		// Where the time before the run went, for a caller's timeline.
		w.Header().Set("Server-Timing", fmt.Sprintf("create;dur=%.1f, lease;dur=%.1f",
			ms(created.Sub(start)), ms(ready.Sub(created))))
		if t, code, reason, msg = s.resolve(r.Context(), ns, ses.Name); t == nil {
			writeStatus(w, code, reason, msg+"; the code has not run")
			return
		}
	} else {
		metrics.DataPlaneRunLease.Observe(created.Sub(start).Seconds())
		w.Header().Set("Server-Timing", fmt.Sprintf("create;dur=%.1f, lease;dur=0", ms(created.Sub(start))))
	}
	closeIt = !req.Keep
	s.runThroughSeal(w, r, t, pool, &req.ExecRequest)
	// Out now: the close that follows must not hold the answer back in the
	// server's buffer (a plain exec needs no flush: its handler ends here).
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	if r.Context().Err() != nil && closeIt {
		closeIt = false
		s.Log.V(1).Info("the caller of a one-call run went away; its Session stays for the caller to ask about the run",
			"namespace", ns, "session", ses.Name, "run", req.ID)
	}
}

// createRun creates a one-call run's Session. When the pool has an idle pod
// and nothing waits for one, it claims that pod for the run at the same
// time (lease.ClaimForRun) and returns it to run on: the code then waits for
// one write's time, not for the create, the manager's lease and its watch
// event in a row. Both writes must be stored before the code runs: the
// claim makes the pod the run's alone, and the create is where admission
// (quotas, policies, the owner) says yes to the Session at all. The manager
// adopts the pod for the Session afterwards (AnnotationClaimedPod). A
// Session kept after the run (keep), or one of a shared pool, whose
// tenants' limits the manager's dispatcher keeps, is leased by the manager
// as before; so is one whose claim lost a race.
func (s *Server) createRun(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, keep bool) (*target, error) {
	var pod *corev1.Pod
	if !keep && pool.Namespace == ses.Namespace && pool.Spec.Sharing == nil && pool.Status.PendingExecutions == 0 &&
		pool.DeletionTimestamp == nil && (s.KeysLoaded == nil || s.KeysLoaded()) {
		pod = s.idle.take(client.ObjectKeyFromObject(pool), ses.Namespace, func(p *corev1.Pod) bool {
			return s.nodes.Excludes(pool, p.Spec.NodeName) == ""
		})
	}
	if pod == nil {
		return nil, s.Client.Create(ctx, ses)
	}
	ses.Annotations[sandboxv1alpha1.AnnotationClaimedPod] = pod.Name
	before, claiming := pod.DeepCopy(), ses.DeepCopy()
	claimed := make(chan error, 1)
	go func() { claimed <- lease.ClaimForRun(ctx, s.Client, pod, claiming, time.Now()) }()
	err := s.Client.Create(ctx, ses)
	cerr := <-claimed
	switch {
	case err != nil && cerr == nil:
		// Nothing ran on it: idle again, as it was.
		if uerr := lease.UnclaimRun(context.WithoutCancel(ctx), s.Client, before, pod); uerr != nil {
			s.Log.Info("could not give back a pod claimed for a run whose Session was refused; its pool frees it", "pod", pod.Name, "err", uerr.Error())
		}
		return nil, err
	case err != nil:
		return nil, err
	case cerr != nil:
		// The Session is stored: the manager leases it a pod as any other,
		// once it no longer waits for this one.
		s.Log.V(1).Info("a one-call run's claim did not commit; the manager leases its Session", "pod", pod.Name, "err", cerr.Error())
		s.dropClaimedPod(ctx, ses)
		return nil, nil
	}
	agent, err := s.Gate.Open(ctx, pool, pod, agentgate.ForRun(ses, pod))
	if err != nil {
		// A pod the gate refuses (one a tenant made to look like the pool's,
		// say) is not waited for: the manager leases the Session another.
		s.Log.Info("cannot run on the pod claimed for a one-call run; the manager leases its Session", "pod", pod.Name, "err", err.Error())
		s.dropClaimedPod(ctx, ses)
		return nil, nil
	}
	return &target{ses: ses, pod: pod, pool: pool, agent: agent}, nil
}

// dropClaimedPod takes AnnotationClaimedPod off a one-call run's Session, so
// that it waits for no pod of the data plane's and the manager leases it one
// at once (else after ClaimedPodGrace). The patch names the Session's UID.
func (s *Server) dropClaimedPod(ctx context.Context, ses *sandboxv1alpha1.Session) {
	patch := fmt.Appendf(nil, `{"metadata":{"uid":%q,"annotations":{%q:null}}}`, ses.UID, sandboxv1alpha1.AnnotationClaimedPod)
	if err := s.Client.Patch(ctx, ses, client.RawPatch(types.MergePatchType, patch)); err != nil {
		s.Log.Info("could not take back a one-call Session's claimed pod; it waits out its grace", "session", ses.Name, "err", err.Error())
	}
}

// mayCreateAndRun asks, as the caller, for the two rights the one call
// stands for: creating a Session, and running code in it. The answers are
// cached by the delegating authorizer, like the request's own.
func (s *Server) mayCreateAndRun(ctx context.Context, caller user.Info, ns string) (refused string) {
	for _, a := range []authorizer.AttributesRecord{
		{User: caller, Verb: "create", Namespace: ns, APIGroup: sandboxv1alpha1.GroupVersion.Group, APIVersion: sandboxv1alpha1.GroupVersion.Version,
			Resource: "sessions", ResourceRequest: true},
		{User: caller, Verb: "create", Namespace: ns, APIGroup: Group, APIVersion: Version,
			Resource: "sessions", Subresource: SubExec, ResourceRequest: true},
	} {
		if refused := s.may(ctx, a, "which a run that creates its Session needs"); refused != "" {
			return refused
		}
	}
	return ""
}

// oneCallSession is the Session of a one-call run.
func oneCallSession(ns, name, owner string, req *sessions.RunRequest) *sandboxv1alpha1.Session {
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Annotations: map[string]string{sandboxv1alpha1.AnnotationRun: req.ID}},
		Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.ParsePoolReference(req.Pool), Owner: owner}}
	if req.OwnerOnly {
		ses.Spec.Access = sandboxv1alpha1.SessionAccessOwner
	}
	switch {
	case req.IdleTimeoutMillis > 0:
		ses.Spec.IdleTimeout = &metav1.Duration{Duration: time.Duration(req.IdleTimeoutMillis) * time.Millisecond}
	case !req.Keep:
		ses.Spec.IdleTimeout = &metav1.Duration{Duration: oneCallIdleTimeout}
	}
	return ses
}

// waitReady waits until ses is Ready in the cache, as the Session
// controller's status write arrives there, for at most wait. It reads only
// the cache: a thousand runs waiting for a busy pool cost the API server
// nothing.
//
// A Suspended Session is asked to resume (the run is its next one), and
// leaving names a pod the Session must not be Ready on: the one a suspend
// sealed under a run, which the run waits to see the Session leave.
func (s *Server) waitReady(ctx context.Context, ses *sandboxv1alpha1.Session, wait time.Duration, leaving string) (*sandboxv1alpha1.Session, int, metav1.StatusReason, string) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	key := client.ObjectKeyFromObject(ses)
	// A look at the cache every second as well as at each change.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen := false // the cache has shown the Session: gone from it now means deleted
	last := ses
	for {
		changed := s.ready.subscribe(key)
		cur := &sandboxv1alpha1.Session{}
		err := s.Client.Get(ctx, key, cur)
		code, msg := 0, ""
		switch {
		case apierrors.IsNotFound(err) && seen:
			code, msg = http.StatusConflict, fmt.Sprintf("Session %s was deleted before it was Ready", ses.Name)
		case apierrors.IsNotFound(err):
			// The cache has not seen the create yet.
		case err != nil && ctx.Err() == nil:
			code, msg = http.StatusInternalServerError, "read the run's Session: "+err.Error()
		case err != nil:
		case cur.UID != ses.UID:
			code, msg = http.StatusConflict, fmt.Sprintf("Session %s was deleted and made again by someone else", ses.Name)
		case cur.Status.Phase == sandboxv1alpha1.SessionReady && cur.Status.PodName != "" && cur.Status.PodName != leaving:
			s.ready.unsubscribe(key, changed)
			return cur, 0, "", ""
		case cur.Status.Phase == sandboxv1alpha1.SessionSuspended && !cur.ResumeRequested() && cur.Status.Snapshot != nil:
			if err := s.requestResume(ctx, cur); err != nil && ctx.Err() == nil {
				code, msg = http.StatusInternalServerError, fmt.Sprintf("ask Session %s to resume: %v", ses.Name, err)
			}
			seen, last = true, cur
		case cur.Status.Phase.IsFinished():
			code, msg = http.StatusConflict, fmt.Sprintf("Session %s ended %s before it was Ready (%s)",
				ses.Name, cur.Status.Phase, readyCondition(cur))
		default:
			seen, last = true, cur
		}
		if code != 0 {
			s.ready.unsubscribe(key, changed)
			reason := metav1.StatusReasonConflict
			if code == http.StatusInternalServerError {
				reason = metav1.StatusReasonInternalError
			}
			return nil, code, reason, msg
		}
		select {
		case <-changed:
		case <-tick.C:
			s.ready.unsubscribe(key, changed)
		case <-ctx.Done():
			s.ready.unsubscribe(key, changed)
			if context.Cause(ctx) == context.DeadlineExceeded {
				return nil, http.StatusGatewayTimeout, metav1.StatusReasonTimeout,
					fmt.Sprintf("Session %s was not Ready within %s (%s); it is closed", ses.Name, wait, readyCondition(last))
			}
			return nil, http.StatusRequestTimeout, metav1.StatusReasonTimeout, fmt.Sprintf("the request ended while Session %s waited for a pod", ses.Name)
		}
	}
}

// requestResume asks the Session controller to resume a Suspended Session
// from the snapshot its status names (the lease is the controller's).
func (s *Server) requestResume(ctx context.Context, ses *sandboxv1alpha1.Session) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, sandboxv1alpha1.AnnotationResume, ses.Status.Snapshot.Key)
	return s.Client.Patch(ctx, ses, client.RawPatch(types.MergePatchType, patch))
}

func readyCondition(ses *sandboxv1alpha1.Session) string {
	for _, c := range ses.Status.Conditions {
		if c.Type == sandboxv1alpha1.SessionConditionReady && c.Reason != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return "no status yet"
}

// closeSession ends a one-call Session (spec.close): its pod goes back to its
// pool, as the pool's reusePolicy says, once no run holds it. The patch names
// the Session's UID, which the API server will not change: a Session someone
// deleted and made again under the name meanwhile is refused it (422), not
// closed.
func (s *Server) closeSession(ctx context.Context, ses *sandboxv1alpha1.Session) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"uid":%q},"spec":{"close":true}}`, ses.UID))
	switch err := s.Client.Patch(ctx, ses, patch); {
	case err == nil || apierrors.IsNotFound(err):
	case apierrors.IsInvalid(err):
		s.Log.V(1).Info("a one-call run's Session was made again under its name: the new one is not closed", "namespace", ses.Namespace, "session", ses.Name)
	default:
		s.Log.Info("could not close a one-call run's Session; its idle timeout will", "namespace", ses.Namespace, "session", ses.Name, "err", err.Error())
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
