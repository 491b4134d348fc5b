package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/controller/recycle"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/membudget"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// The suspend policy. A Ready Session idle past its suspendAfter is
// suspended: the agent takes a sealing snapshot (after it, the pod refuses
// every run, so nothing can change the state the snapshot took), the
// snapshot goes to the store under a new key, and then the Suspended status
// naming that key is stored: that write is the commit point. Only after it
// is the pod freed. A manager that stops anywhere before leaves the Session
// Ready on a sealed pod, which the next look finishes suspending (the seal,
// not the idle time, decides then); one that stops after leaves it Suspended
// with a complete snapshot and, at worst, a pod the pool frees as an orphan.
//
// A Suspended Session asked to resume (AnnotationResume) leases a warm pod
// as a new Session does, and restores its snapshot there before its Ready
// status is stored; a pod lost meanwhile is discarded and another one taken.
// The snapshot is deleted once the Session is Ready again, or when it ends.

// SnapshotFinalizer keeps a Session that has snapshots in the store until
// they are deleted with it.
const SnapshotFinalizer = "sandbox.warmpool.dev/snapshots"

const (
	// suspendTimeout bounds one suspend (snapshot and upload).
	suspendTimeout = 2 * time.Minute
	// suspendRetry is when a Session whose suspend failed is tried again.
	suspendRetry = 5 * time.Minute
	// maxSkippedInStatus and maxSkippedName bound status.snapshot.skipped:
	// a name longer than the Session's status may hold would fail every
	// suspend's commit.
	maxSkippedInStatus = 32
	maxSkippedName     = 128
	// resumeHold is the least time a resumed Session keeps its pod.
	resumeHold = 10 * time.Second
)

func suspendAfter(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool) time.Duration {
	switch {
	case ses.Spec.SuspendAfter != nil:
		return ses.Spec.SuspendAfter.Duration
	case pool != nil && pool.Spec.SessionSuspendAfter != nil:
		return pool.Spec.SessionSuspendAfter.Duration
	}
	return 0
}

// suspendDue is how long until the Session is to be suspended (<= 0: now),
// and whether it is to be suspended at all.
func (r *Reconciler) suspendDue(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, last *metav1.Time, now time.Time) (time.Duration, bool) {
	after := suspendAfter(ses, pool)
	if r.Snapshots == nil || after <= 0 || after >= idleTimeout(ses, pool) || last == nil {
		return 0, false
	}
	due := last.Add(after).Sub(now)
	// A Session just resumed is kept for resumeHold at least: the run that
	// asked for it (an Execution still to claim the pod) must get there
	// before the Session is suspended again, or the two chase each other.
	if c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil &&
		c.Reason == sandboxv1alpha1.ReasonResumed {
		due = max(due, c.LastTransitionTime.Add(resumeHold).Sub(now))
	}
	r.mu.Lock()
	retry, failed := r.suspendFailed[ses.UID]
	r.mu.Unlock()
	if failed && retry.After(now) {
		due = max(due, retry.Sub(now))
	}
	return due, true
}

func owner(ses *sandboxv1alpha1.Session) snapshotstore.Owner {
	return snapshotstore.Owner{Namespace: ses.Namespace, UID: ses.UID}
}

// suspend snapshots the Session into the store and stores its Suspended
// status, then frees its pod. move, when set, says why the Session's node
// is drained: the Session resumes on another node at once (move.go).
func (r *Reconciler) suspend(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, last *metav1.Time, runs int64, move string) (ctrl.Result, error) {
	start := time.Now() // a measurement, not a decision
	// No checkpoint of it may land after the suspend's snapshot (and delete it).
	r.stopCheckpoints(client.ObjectKeyFromObject(ses))
	begun := metav1.NewTime(r.Clock.Now())
	var idleFor time.Duration
	if last != nil {
		idleFor = r.Clock.Since(last.Time)
	}
	log := logf.FromContext(ctx)
	fail := func(err error) (ctrl.Result, error) {
		metrics.SessionSuspend.WithLabelValues("failed").Observe(time.Since(start).Seconds())
		// The pod stays the Session's, serving again.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if agent, aerr := r.agent(ctx, ses, pod, agentgate.ForSession(ses)); aerr == nil {
			if uerr := agent.Unseal(uctx); uerr != nil {
				log.Info("could not unseal the pod after a failed suspend; the next look tries again", "pod", pod.Name, "err", uerr.Error())
			}
		}
		if uerr := recycle.RetryPodUpdate(uctx, r.APIReader, pod, func(p *corev1.Pod) error {
			return lease.UnmarkSuspending(uctx, r.Client, p)
		}); uerr != nil {
			log.Info("could not give the pod back to the Session's Executions after a failed suspend", "pod", pod.Name, "err", uerr.Error())
		}
		r.mu.Lock()
		r.suspendFailed[ses.UID] = r.Clock.Now().Add(suspendRetry)
		r.mu.Unlock()
		if move != "" {
			return r.cannotMove(ctx, ses, pod, move, err)
		}
		r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, sandboxv1alpha1.ReasonSuspendFailed, "Suspend",
			"Session keeps pod %s: %v; trying again in %s", pod.Name, err, suspendRetry)
		return ctrl.Result{RequeueAfter: suspendRetry}, nil
	}
	agent, err := r.agent(ctx, ses, pod, agentgate.ForSession(ses))
	if err != nil {
		return ctrl.Result{}, err
	}
	// The snapshot is held in this process's memory until it is stored:
	// taken from its budget as it is read (a full budget is looked at again
	// soon, and the Session keeps its pod meanwhile).
	hold, err := r.Memory.Acquire("suspend", ses.Namespace, 0)
	if err != nil {
		return r.budgetFull(ctx, ses, err)
	}
	defer hold.Release()
	// First the pod is taken from the Session's Executions (an Execution
	// claiming it at the same moment makes this fail, or that fail), then
	// the agent is sealed against data-plane runs.
	if err := lease.MarkSuspending(ctx, r.Client, pod, ses); err != nil {
		if apierrors.IsConflict(err) || errors.Is(err, lease.ErrNotClaimable) {
			return ctrl.Result{RequeueAfter: time.Second}, nil // an Execution came first: not idle after all
		}
		return ctrl.Result{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, suspendTimeout)
	defer cancel()
	body, _, err := agent.Snapshot(sctx, agentgate.SnapshotOptions{Seal: true, Workspace: true, MaxBytes: r.Snapshots.MaxBytes()})
	if agentgate.IsStatus(err, http.StatusConflict) {
		// A data-plane run started meanwhile: not idle after all, and the
		// Session's Executions may have the pod again.
		if uerr := recycle.RetryPodUpdate(ctx, r.APIReader, pod, func(p *corev1.Pod) error {
			return lease.UnmarkSuspending(ctx, r.Client, p)
		}); uerr != nil {
			return ctrl.Result{}, uerr
		}
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return fail(fmt.Errorf("snapshot: %w", err))
	}
	// The agent shares its container with the code: read no more than was asked for.
	chunks, err := hold.ReadAll(body, snapshot.MaxSize(r.Snapshots.MaxBytes()))
	_ = body.Close()
	if membudget.IsFull(err) {
		return r.undoSuspend(ctx, ses, pod, err)
	}
	if err != nil {
		return fail(fmt.Errorf("read the snapshot: %w", err))
	}
	// The store seals one array, into another as large.
	n := chunks.Len()
	if err := hold.Grow(2 * n); err != nil {
		return r.undoSuspend(ctx, ses, pod, err)
	}
	data := make([]byte, 0, n)
	for _, c := range chunks {
		data = append(data, c...)
	}
	hold.Shrink(2 * n) // the chunks are garbage: the array and the sealed copy
	m, err := snapshot.ReadHeader(bytes.NewReader(data))
	if err != nil {
		return fail(err)
	}
	if !controllerutil.ContainsFinalizer(ses, SnapshotFinalizer) {
		controllerutil.AddFinalizer(ses, SnapshotFinalizer)
		if err := r.Update(ctx, ses); err != nil {
			return ctrl.Result{}, fmt.Errorf("add the snapshot finalizer to session %s: %w", ses.Name, err)
		}
	}
	// A store that does not answer must not hold this worker for long: 20 s,
	// and a second more per 10 MB.
	pctx, cancelPut := context.WithTimeout(ctx, 20*time.Second+time.Duration(len(data)/(10<<20))*time.Second)
	defer cancelPut()
	key, err := r.Snapshots.Put(pctx, owner(ses), data)
	if err != nil {
		return fail(err)
	}
	now := metav1.NewTime(r.Clock.Now())
	fromPod := ses.Status.PodName
	ses.Status.Phase = sandboxv1alpha1.SessionSuspended
	ses.Status.PodName, ses.Status.PodUID, ses.Status.Interpreter = "", "", ""
	ses.Status.SuspendTime = &now
	if last != nil { // the idle timeout of a Suspended Session counts from its last run
		t := last.Rfc3339Copy()
		ses.Status.LastActivityTime = &t
	}
	ses.Status.Runs = max(ses.Status.Runs, runs)
	ses.Status.Snapshot = snapshotStatus(key, int64(len(data)), m, now)
	if move != "" {
		ses.Status.LastMove = &sandboxv1alpha1.SessionMove{FromNode: pod.Spec.NodeName, Reason: move, StartTime: begun}
		r.mu.Lock()
		r.moveBegun[ses.UID] = begun.Time
		r.mu.Unlock()
		meta.RemoveStatusCondition(&ses.Status.Conditions, sandboxv1alpha1.SessionConditionMovable)
		r.setReady(ses, metav1.ConditionFalse, sandboxv1alpha1.ReasonMoving, fmt.Sprintf(
			"%s: its state (%d bytes, %d variables) is saved and pod %s freed; it resumes on a pod of another node now",
			move, len(data), len(m.Variables), fromPod))
	} else {
		r.setReady(ses, metav1.ConditionFalse, sandboxv1alpha1.ReasonSuspended, fmt.Sprintf(
			"idle for %s: its state (%d bytes, %d variables) is saved and pod %s freed; the next run resumes it",
			idleFor.Round(time.Second), len(data), len(m.Variables), fromPod))
	}
	if err := r.Status().Update(ctx, ses); err != nil {
		// Not committed: the Session is Ready on its sealed pod, which the
		// next look suspends again under a new key (this one is deleted with
		// the Session's others).
		return ctrl.Result{}, fmt.Errorf("store Suspended status of session %s: %w", ses.Name, err)
	}
	r.mu.Lock()
	delete(r.statusWritten, ses.UID)
	delete(r.suspendFailed, ses.UID)
	r.mu.Unlock()
	r.Dispatcher.UpdateSession(ses)
	metrics.SessionSuspend.WithLabelValues("suspended").Observe(time.Since(start).Seconds())
	if move != "" {
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, sandboxv1alpha1.ReasonMoving, "Move",
			"%s: saved %d bytes and freed pod %s; resuming on another node", move, len(data), fromPod)
	} else {
		r.Recorder.Eventf(ses, nil, corev1.EventTypeNormal, sandboxv1alpha1.ReasonSuspended, "Suspend",
			"Saved %d bytes and freed pod %s", len(data), fromPod)
	}
	if len(m.Skipped) > 0 {
		r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, sandboxv1alpha1.ReasonSuspended, "Suspend",
			"Not saved (they will be missing after the resume): %v", ses.Status.Snapshot.Skipped)
	}
	// Snapshots of earlier suspends, and of attempts that did not commit.
	if err := r.Snapshots.DeleteAll(ctx, owner(ses), key); err != nil {
		log.Info("could not delete older snapshots; they go with the Session", "err", err.Error())
	}
	res, err := r.free(ctx, ses)
	if move != "" && err == nil {
		// The resume follows at once: nothing else wakes a Suspended Session.
		res.RequeueAfter = min(res.RequeueAfter, time.Millisecond)
		if res.RequeueAfter <= 0 {
			res.RequeueAfter = time.Millisecond
		}
	}
	return res, err
}

// budgetFull looks at a Session again once the memory budget may take its
// suspend or resume: nothing of it changed.
func (r *Reconciler) budgetFull(ctx context.Context, ses *sandboxv1alpha1.Session, err error) (ctrl.Result, error) {
	logf.FromContext(ctx).V(1).Info("waiting for memory", "reason", err.Error())
	return ctrl.Result{RequeueAfter: membudget.RetryAfter}, nil
}

// undoSuspend gives a Session that was being suspended its pod back, as it
// was, when the memory budget could not take its snapshot: not a failure of
// the suspend, which is tried again soon.
func (r *Reconciler) undoSuspend(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, why error) (ctrl.Result, error) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	agent, err := r.agent(uctx, ses, pod, agentgate.ForSession(ses))
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := agent.Unseal(uctx); err != nil {
		return ctrl.Result{}, fmt.Errorf("unseal pod %s after its snapshot waited for memory: %w", pod.Name, err)
	}
	if err := recycle.RetryPodUpdate(uctx, r.APIReader, pod, func(p *corev1.Pod) error {
		return lease.UnmarkSuspending(uctx, r.Client, p)
	}); err != nil {
		return ctrl.Result{}, err
	}
	return r.budgetFull(ctx, ses, why)
}

func snapshotStatus(key string, size int64, m *snapshot.Manifest, at metav1.Time) *sandboxv1alpha1.SessionSnapshot {
	s := &sandboxv1alpha1.SessionSnapshot{Key: key, Bytes: size, Variables: int32(len(m.Variables)), Time: at}
	for _, sk := range m.Skipped {
		if len(s.Skipped) == maxSkippedInStatus {
			break
		}
		name := sk.Name // the code's own name, of any length
		if len(name) > maxSkippedName {
			name = name[:maxSkippedName] + "..."
		}
		s.Skipped = append(s.Skipped, name)
	}
	if m.Workspace != nil {
		s.WorkspaceFiles = int32(m.Workspace.Files)
	}
	return s
}

// suspended watches a Suspended Session: its idle timeout and maximum
// lifetime still end it; asked to resume, it leases a pod.
func (r *Reconciler) suspended(ctx context.Context, ses *sandboxv1alpha1.Session) (ctrl.Result, error) {
	now := r.Clock.Now()
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil
	}
	if m := ses.Spec.MaxLifetime; m != nil && ses.Status.ReadyTime != nil && !now.Before(ses.Status.ReadyTime.Add(m.Duration)) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonMaxLifetime,
			fmt.Sprintf("reached its maximum lifetime of %s", m.Duration))
	}
	idle := idleTimeout(ses, pool)
	last := ses.Status.LastActivityTime
	if last != nil && !now.Before(last.Add(idle)) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionClosed, sandboxv1alpha1.ReasonIdleTimeout,
			fmt.Sprintf("idle for %s (idleTimeout %s) while suspended", now.Sub(last.Time).Round(time.Second), idle))
	}
	if ses.ResumeRequested() {
		return r.lease(ctx, ses)
	}
	next := waitBackstop
	if last != nil {
		next = min(next, last.Add(idle).Sub(now)+10*time.Millisecond)
	}
	if ses.Status.SuspendTime != nil && now.Sub(ses.Status.SuspendTime.Time) < lease.OrphanSessionPodGrace {
		// A manager that stopped between the status and freeing the pod.
		if _, err := r.free(ctx, ses); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: max(next, 10*time.Millisecond)}, nil
}

// snapshotLost: the Session's snapshot cannot be restored anywhere.
type snapshotLost struct{ msg string }

func (e *snapshotLost) Error() string { return e.msg }

// fetched is a snapshot read from the store.
type fetched struct {
	data []byte
	err  error
}

// fetch reads a resuming Session's snapshot from the store.
func (r *Reconciler) fetch(ctx context.Context, ses *sandboxv1alpha1.Session) fetched {
	if r.Snapshots == nil {
		return fetched{err: &snapshotLost{msg: "the Session's state is in a snapshot store the manager is no longer configured with"}}
	}
	data, err := r.Snapshots.Get(ctx, owner(ses), ses.Status.Snapshot.Key)
	switch {
	case errors.Is(err, snapshotstore.ErrNotFound):
		err = &snapshotLost{msg: fmt.Sprintf("its snapshot is gone from the store: %v", err)}
	case errors.Is(err, snapshotstore.ErrSealed):
		err = &snapshotLost{msg: err.Error()}
	}
	return fetched{data: data, err: err}
}

// resumeCost is what a resume of a snapshot of n bytes holds at most: the
// sealed bytes as read (an array that grew to up to twice them) and the
// opened ones.
func resumeCost(n int64) int64 { return 3*n + 1<<20 }

// restore puts a resuming Session's snapshot into the interpreter of its
// new pod. A failure of the pod is an error (the pod is discarded and
// another taken); a snapshot that cannot be restored anywhere is snapshotLost.
func (r *Reconciler) restore(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, snap fetched) error {
	if snap.err != nil {
		var lost *snapshotLost
		if errors.As(snap.err, &lost) {
			return lost
		}
		// The store did not answer: not the pod's fault; the next look asks again.
		return &storeFailed{snap.err}
	}
	agent, err := r.agent(ctx, ses, pod, agentgate.ForSessionLease(ses, pod))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, suspendTimeout)
	defer cancel()
	// Unsealing first: the pod it was suspended from, adopted again, is still
	// sealed. A move's restore asks the next run to say it moved.
	// The run count goes on from the state's (a checkpoint's may be behind
	// the Session's: the runs after it are the ones to redo).
	var runs int64
	if m, err := snapshot.ReadHeader(bytes.NewReader(snap.data)); err == nil {
		runs = m.Runs
	}
	var moved *protocol.Moved
	if mv := ses.Status.LastMove; mv != nil && mv.EndTime == nil {
		moved = &protocol.Moved{FromNode: mv.FromNode, ToNode: pod.Spec.NodeName, Reason: mv.Reason, Since: mv.StartTime.Time, Run: runs}
		if c := mv.Checkpoint; c != nil {
			t := c.Time.Time
			moved.Checkpoint = &t
		}
	}
	_, err = agent.Restore(ctx, bytes.NewReader(snap.data), agentgate.RestoreOptions{Unseal: true, Moved: moved, Runs: runs})
	var ae *agentgate.APIError
	if errors.As(err, &ae) && ae.Code >= 400 && ae.Code < 500 && ae.Code != http.StatusConflict {
		return &snapshotLost{msg: fmt.Sprintf("pod %s refused its snapshot: %s", pod.Name, ae.Message)}
	}
	if err != nil {
		return fmt.Errorf("restore the snapshot on pod %s: %w", pod.Name, err)
	}
	return nil
}

// storeFailed: the store did not give the snapshot back this time.
type storeFailed struct{ err error }

func (e *storeFailed) Error() string { return "read the snapshot from the store: " + e.err.Error() }

// discard deletes a pod a resume failed on: it holds a half-restored state
// of the Session, and no other Session may get it.
func (r *Reconciler) discard(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, why error) (ctrl.Result, error) {
	logf.FromContext(ctx).Info("the resume failed on this pod; deleting it and taking another", "pod", pod.Name, "err", why.Error())
	r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, sandboxv1alpha1.ReasonResuming, "Resume",
		"Resume on pod %s failed (%v); trying another pod", pod.Name, why)
	uid := pod.UID
	if err := r.Delete(ctx, pod, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("delete pod %s after a failed resume: %w", pod.Name, err)
	}
	r.Dispatcher.ClaimFailed(ses.UID, pod.Name, "")
	return ctrl.Result{RequeueAfter: claimRetry}, nil
}

// resumed deletes the snapshot a Session was resumed from: its state lives
// in its pod again.
func (r *Reconciler) resumed(ctx context.Context, ses *sandboxv1alpha1.Session) {
	if r.Snapshots == nil {
		return
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil
	}
	if checkpointPolicy(ses, pool) != nil {
		// It is the durable Session's checkpoint until its first one here,
		// which deletes it.
		return
	}
	if err := r.Snapshots.DeleteAll(ctx, owner(ses), ""); err != nil {
		logf.FromContext(ctx).Info("could not delete the snapshot the Session resumed from; it goes with the Session", "err", err.Error())
	}
}

// dropSnapshots deletes an ended or deleted Session's snapshots, then its finalizer.
func (r *Reconciler) dropSnapshots(ctx context.Context, ses *sandboxv1alpha1.Session) error {
	if !controllerutil.ContainsFinalizer(ses, SnapshotFinalizer) {
		return nil
	}
	if r.Snapshots != nil {
		if err := r.Snapshots.DeleteAll(ctx, owner(ses), ""); err != nil {
			return fmt.Errorf("delete the snapshots of session %s: %w", ses.Name, err)
		}
	} else {
		logf.FromContext(ctx).Info("the manager has no snapshot store any more: the Session's snapshots stay in the old one")
	}
	controllerutil.RemoveFinalizer(ses, SnapshotFinalizer)
	if err := r.Update(ctx, ses); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the snapshot finalizer of session %s: %w", ses.Name, err)
	}
	return nil
}

// agent opens the pod's agent for ses (h: agentgate.ForSession, or
// ForSessionLease while the lease is being taken).
func (r *Reconciler) agent(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, h agentgate.Holder) (*agentgate.Agent, error) {
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil // the gate refuses a pod without its pool
	}
	return r.Gate.Open(ctx, pool, pod, h)
}
