// Package runner runs Executions on their sandbox pods' agents without holding
// a reconcile worker: each run is a goroutine that calls the agent, enforces
// the timeout from the manager's side too, and reports its outcome by
// triggering a reconcile of the Execution.
//
// The timeout story: the agent gets the deadline and the grace period with the
// request and stops the code itself (SIGINT, then kill), so code stops even if
// the manager is down. At the deadline the runner also asks the agent to
// interrupt. If the agent has not answered by deadline + grace + slack, the run
// ends with ErrNoAnswer and the controller deletes the pod.
package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/agent/output"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Slack is how long after deadline + grace the runner still waits for the agent.
const Slack = 3 * time.Second

// ErrNoAnswer: the agent did not answer in time (unreachable, or the code did not stop).
var ErrNoAnswer = errors.New("the sandbox agent did not answer")

// ErrNotStarted: on re-attach, the agent does not know the run (the request
// never reached it, or the agent restarted and lost it).
var ErrNotStarted = errors.New("the sandbox agent does not know this run")

// ErrBusy: the agent refused the run until its deadline because the
// interpreter was running another run of the same Session; the code never ran.
var ErrBusy = errors.New("the sandbox's interpreter was busy with another run of the session until the deadline; the code never ran")

// attachPoll is how often a re-attached run asks the agent how it ended.
const attachPoll = 500 * time.Millisecond

// Job is one run.
type Job struct {
	UID       types.UID
	Namespace string
	Name      string
	// Pod runs the job; StartTime is when the Execution was marked Running.
	Pod       string
	PodUID    types.UID
	StartTime time.Time
	// Agent is the pod's agent, as the gate opened it for this Execution
	// (agentgate): the runner calls nothing else.
	Agent *agentgate.Agent
	// CodeDigest is the digest of Request.Code, for the status.
	CodeDigest string
	Request    protocol.ExecuteRequest
	Deadline   time.Time
	Grace      time.Duration
	// Bridge, when set, answers the code's llm_query/rlm_query calls (the
	// pool's ModelEndpoint); unset, those calls raise in the code.
	// MaxBridgeCalls is the agent's bound on them.
	Bridge         func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer
	MaxBridgeCalls int
	// Fresh: this is the code's first send (no manager sent it before), so
	// whether its request was written says whether the code can have run.
	Fresh bool
}

// maxBridgeCallsInFlight bounds the model calls of one run answered at once.
const maxBridgeCallsInFlight = 4

// Outcome of a run: a Result from the agent, or Err when there is none.
type Outcome struct {
	Result *protocol.Result
	Err    error
	// Stdout and Stderr are what the agent streamed before a run ended with
	// Err (the pod died, the agent stopped answering): the code's last words.
	Stdout, Stderr string
	// Cancelled is true when Cancel was called.
	Cancelled bool
	// At is when the run ended, as far as this runner knows.
	At time.Time
}

type run struct {
	job Job
	// out holds what the agent streamed so far (Start only).
	out *partialOutput
	// since is when this runner took the run (started or re-attached to it).
	since     time.Time
	cancel    context.CancelFunc
	cancelled bool
	done      bool
	outcome   Outcome
	// sent is closed once the run's goroutine has ended, so the request that
	// carries the code can no longer be written (Start only: nil for a run
	// re-attached to); written is set when some of it may have been.
	sent    chan struct{}
	written bool
}

// Runner tracks the runs of one manager.
type Runner struct {
	mu   sync.Mutex
	runs map[types.UID]*run
	// wake asks for a reconcile of the Execution whenever a run ends. It must
	// not block: a run's goroutine must end even when nobody reconciles.
	wake func(types.NamespacedName)
}

// New returns a Runner; wake asks for a reconcile of an Execution (without blocking).
func New(wake func(types.NamespacedName)) *Runner {
	return &Runner{runs: map[types.UID]*run{}, wake: wake}
}

// Start runs the job unless a run of this UID is already tracked. Starting the
// same Execution again after a manager restart attaches to the run in the
// agent (the request ID is the UID), so the code never runs twice.
func (r *Runner) Start(job Job) {
	ctx, cancel, ok := r.track(job, job.Deadline.Add(job.Grace+Slack))
	if !ok {
		return
	}
	sent := make(chan struct{})
	r.mu.Lock()
	r.runs[job.UID].sent = sent
	r.mu.Unlock()
	// Whether the code may have reached the agent: only a run whose request
	// was never written can be given to another pod (Abandon).
	sendCtx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { r.markWritten(job.UID) },
	})

	c := job.Agent
	req := job.Request
	req.ID = string(job.UID)
	req.TimeoutMillis = max(time.Until(job.Deadline).Milliseconds(), 1)
	req.GraceMillis = job.Grace.Milliseconds()
	go func() {
		// Closed when this goroutine ends, its outcome recorded: Abandon's
		// caller may then start the run anew without this one's outcome
		// landing on it.
		defer close(sent)
		defer cancel()
		// The manager's own interrupt just after the deadline, in case the agent's
		// timer did not fire; the agent's own one, a moment earlier, names it a timeout.
		timer := time.AfterFunc(time.Until(job.Deadline)+250*time.Millisecond, func() {
			ictx, icancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer icancel()
			_ = c.Interrupt(ictx, req.ID)
		})
		defer timer.Stop()
		// Streamed, so that what the code printed survives an agent that dies
		// with it (an OOM kill of the container, an eviction).
		limit := req.MaxOutputBytes
		if limit <= 0 {
			limit = protocol.DefaultMaxOutputBytes
		}
		out := r.partial(job.UID, limit)
		onEvent := out.add
		if job.Bridge != nil {
			req.Bridge, req.MaxBridgeCalls = true, job.MaxBridgeCalls
			inFlight := make(chan struct{}, maxBridgeCallsInFlight)
			onEvent = func(ev protocol.Event) {
				if ev.Type != protocol.EventBridge || ev.Call == nil {
					out.add(ev)
					return
				}
				// Answered aside: the stream goes on being read (and the
				// deadline enforced) while the model thinks. The code
				// controls the events it sends (the agent's own call limit
				// runs inside the interpreter), so a run that floods the
				// stream with calls waits here for a free slot instead of
				// starting a goroutine and a request per event.
				call := *ev.Call
				select {
				case inFlight <- struct{}{}:
				case <-ctx.Done():
					return
				}
				go func() {
					defer func() { <-inFlight }()
					// An answer the agent cannot take (the run ended meanwhile)
					// has nobody waiting for it.
					_ = c.AnswerBridge(ctx, req.ID, call.ID, job.Bridge(ctx, call))
				}()
			}
		}
		res, err := r.execute(sendCtx, c, req, onEvent, job.Deadline)
		if err != nil && !errors.Is(err, ErrBusy) && ctx.Err() == nil && !agentgate.IsAPIError(err) {
			// The connection broke mid-run (a reset, a proxy, the manager's own
			// network): the code may well still run. Follow it by its ID, as a
			// restarted manager does, instead of calling the sandbox lost.
			metrics.AgentErrors.WithLabelValues("execute").Inc()
			r.follow(ctx, job, c)
			return
		}
		o := Outcome{Result: res}
		if errors.Is(err, ErrBusy) {
			r.finish(job.UID, Outcome{Err: err})
			return
		}
		if err != nil {
			metrics.AgentErrors.WithLabelValues("execute").Inc()
			if ctx.Err() != nil {
				err = fmt.Errorf("%w by %s after the deadline: %v", ErrNoAnswer, job.Grace+Slack, err)
			} else {
				err = fmt.Errorf("%w: %v", ErrNoAnswer, err)
			}
			o = Outcome{Err: err}
			o.Stdout, o.Stderr = out.strings()
		}
		r.finish(job.UID, o)
	}()
}

// busyRetry bounds the wait between two sends of a run the agent refused
// because its interpreter was busy.
const busyRetry = 500 * time.Millisecond

// execute sends the run. An agent whose interpreter is busy with another run
// of the same Session (a data-plane run: both paths share one interpreter)
// refuses it with 409 and keeps nothing of it; the run is sent again until
// the agent takes it, so it queues behind the other run, or until its
// deadline, when it ends with ErrBusy without having run.
func (r *Runner) execute(ctx context.Context, c *agentgate.Agent, req protocol.ExecuteRequest, onEvent func(protocol.Event),
	deadline time.Time) (*protocol.Result, error) {
	wait := 50 * time.Millisecond
	for {
		res, err := c.ExecuteStream(ctx, req, onEvent)
		if !agentgate.IsStatus(err, http.StatusConflict) {
			return res, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w: %v", ErrBusy, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", ErrBusy, err)
		case <-time.After(min(wait, left)):
		}
		wait = min(2*wait, busyRetry)
		req.TimeoutMillis = max(time.Until(deadline).Milliseconds(), 1)
	}
}

// partialOutput is what a streamed run printed so far, within the output limit.
type partialOutput struct {
	mu             sync.Mutex
	stdout, stderr *output.Buffer
}

func (p *partialOutput) add(ev protocol.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Type {
	case protocol.EventStdout:
		_, _ = p.stdout.Write([]byte(ev.Data))
	case protocol.EventStderr:
		_, _ = p.stderr.Write([]byte(ev.Data))
	}
}

func (p *partialOutput) strings() (stdout, stderr string) {
	if p == nil {
		return "", ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String("stdout"), p.stderr.String("stderr")
}

func (r *Runner) partial(uid types.UID, limit int) *partialOutput {
	out := &partialOutput{stdout: output.NewBuffer(limit), stderr: output.NewBuffer(limit)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rn, ok := r.runs[uid]; ok {
		rn.out = out
	}
	return out
}

// Partial returns what a run this runner started printed so far: all there
// is of its output when its pod goes away before the agent answers.
func (r *Runner) Partial(uid types.UID) (stdout, stderr string) {
	r.mu.Lock()
	var out *partialOutput
	if rn, ok := r.runs[uid]; ok {
		out = rn.out
	}
	r.mu.Unlock()
	return out.strings()
}

// track records a run unless one of this UID is tracked already.
func (r *Runner) track(job Job, end time.Time) (context.Context, context.CancelFunc, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.runs[job.UID]; ok {
		return nil, nil, false
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	r.runs[job.UID] = &run{job: job, since: time.Now(), cancel: cancel}
	return ctx, cancel, true
}

// Attach follows a run this manager did not start (it restarted, or another
// replica started it): it asks the agent how the run ended, or waits for it
// to end, without sending the code again. Only the agent knows whether the
// code ran, so nothing is decided before it answers: a finished run reports
// its real result however long the manager was away, and a run the agent
// does not know ends with ErrNotStarted for the controller to judge.
func (r *Runner) Attach(job Job) {
	// However late this is, give the agent its grace period to answer.
	end := job.Deadline.Add(job.Grace + Slack)
	if soon := time.Now().Add(job.Grace + Slack); end.Before(soon) {
		end = soon
	}
	ctx, cancel, ok := r.track(job, end)
	if !ok {
		return
	}
	c := job.Agent
	go func() {
		defer cancel()
		r.follow(ctx, job, c)
	}()
}

// follow asks the agent how the run ended, or waits for it to end, without
// sending the code again, until ctx ends.
func (r *Runner) follow(ctx context.Context, job Job, c *agentgate.Agent) {
	id := string(job.UID)
	{
		interrupted := false
		var last error
		for {
			info, err := c.Execution(ctx, id)
			switch {
			case agentgate.IsStatus(err, http.StatusNotFound):
				r.finish(job.UID, Outcome{Err: ErrNotStarted})
				return
			case err == nil && info.Result != nil:
				r.finish(job.UID, Outcome{Result: info.Result})
				return
			case err == nil && !interrupted && time.Now().After(job.Deadline.Add(250*time.Millisecond)):
				// The agent interrupts at the deadline itself; this is the manager's backup.
				_ = c.Interrupt(ctx, id)
				interrupted = true
			}
			if err != nil {
				last = err
			}
			refused := errors.Is(err, syscall.ECONNREFUSED)
			select {
			case <-ctx.Done():
				metrics.AgentErrors.WithLabelValues("attach").Inc()
				if refused {
					// Nothing listens where the agent was: it is gone, and the run with it.
					r.finish(job.UID, Outcome{Err: fmt.Errorf("the sandbox agent is gone (re-attaching: %w)", last)})
					return
				}
				o := Outcome{Err: fmt.Errorf("%w by %s after re-attaching: %v", ErrNoAnswer, job.Grace+Slack, last)}
				o.Stdout, o.Stderr = r.Partial(job.UID)
				r.finish(job.UID, o)
				return
			case <-time.After(attachPoll):
			}
		}
	}
}

func (r *Runner) finish(uid types.UID, o Outcome) {
	r.mu.Lock()
	rn, ok := r.runs[uid]
	if !ok || rn.done {
		r.mu.Unlock()
		return
	}
	o.Cancelled = rn.cancelled
	o.At = time.Now()
	rn.done, rn.outcome = true, o
	job := rn.job
	r.mu.Unlock()
	if r.wake != nil {
		r.wake(types.NamespacedName{Namespace: job.Namespace, Name: job.Name})
	}
}

// Cancel interrupts a run (spec.cancel, or the Execution deleted). If the code
// has not stopped after the grace period, the run ends with ErrNoAnswer.
func (r *Runner) Cancel(uid types.UID) {
	r.mu.Lock()
	rn, ok := r.runs[uid]
	if !ok || rn.done || rn.cancelled {
		r.mu.Unlock()
		return
	}
	rn.cancelled = true
	job := rn.job
	r.mu.Unlock()
	c := job.Agent
	go func() {
		// A cancel can come as soon as the Running status is stored, which is
		// also when the code is sent: the interrupt may reach the agent before
		// the run does (404). Until the agent knows the run, ask again.
		giveUp := time.Now().Add(job.Grace)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := c.Interrupt(ctx, string(uid))
			cancel()
			if err == nil || r.ended(uid) {
				break
			}
			if time.Now().After(giveUp) {
				metrics.AgentErrors.WithLabelValues("interrupt").Inc()
				break
			}
			time.Sleep(cancelRetry)
		}
		time.AfterFunc(job.Grace+time.Second, func() {
			o := Outcome{Err: fmt.Errorf("%w: the code did not stop within %s after the interrupt", ErrNoAnswer, job.Grace)}
			o.Stdout, o.Stderr = r.Partial(uid)
			r.finish(uid, o)
			rn.cancel()
		})
	}()
}

// Abandon gives up a run whose agent can no longer be asked anything (its
// node stopped answering) and reports whether its code may have reached the
// agent. It cuts the run's connection and waits, at most wait, for the
// request to be abandoned: false means no byte of it was written, so the code
// cannot run there, ever, and may run elsewhere. Anything it cannot be sure
// of is true: a run it did not start (re-attached after a restart), a
// request written even in part, one still not abandoned after wait.
func (r *Runner) Abandon(uid types.UID, wait time.Duration) (mayHaveRun bool) {
	r.mu.Lock()
	rn, ok := r.runs[uid]
	if !ok || rn.sent == nil || !rn.job.Fresh {
		r.mu.Unlock()
		return true
	}
	rn.cancelled = true
	cancel, sent := rn.cancel, rn.sent
	r.mu.Unlock()
	cancel()
	select {
	case <-sent:
	case <-time.After(wait):
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return rn.written
}

func (r *Runner) markWritten(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rn, ok := r.runs[uid]; ok {
		rn.written = true
	}
}

// cancelRetry is how often a cancel asks an agent that does not know the run yet.
const cancelRetry = 100 * time.Millisecond

// ended reports whether the run of uid has an outcome (or is not tracked).
func (r *Runner) ended(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rn, ok := r.runs[uid]
	return !ok || rn.done
}

// UIDOf returns the UID of the tracked run of an Execution, by name.
func (r *Runner) UIDOf(namespace, name string) (types.UID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, rn := range r.runs {
		if rn.job.Namespace == namespace && rn.job.Name == name {
			return uid, true
		}
	}
	return "", false
}

// Outcome returns the outcome of a finished run.
func (r *Runner) Outcome(uid types.UID) (Outcome, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rn, ok := r.runs[uid]
	if !ok || !rn.done {
		return Outcome{}, false
	}
	return rn.outcome, true
}

// Since returns when this runner took a run (started it or re-attached).
func (r *Runner) Since(uid types.UID) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rn, ok := r.runs[uid]
	if !ok {
		return time.Time{}, false
	}
	return rn.since, true
}

// Tracked reports whether a run of this UID is known (running or finished).
func (r *Runner) Tracked(uid types.UID) bool {
	_, ok := r.Job(uid)
	return ok
}

// Job returns the job of a tracked run.
func (r *Runner) Job(uid types.UID) (Job, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rn, ok := r.runs[uid]
	if !ok {
		return Job{}, false
	}
	return rn.job, true
}

// Forget drops a finished run once its status is written.
func (r *Runner) Forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rn, ok := r.runs[uid]; ok {
		rn.cancel()
		delete(r.runs, uid)
	}
}
