package sessions

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

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
