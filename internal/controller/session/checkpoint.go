package session

// The checkpoint policy. A durable Session (spec.checkpoint, or its pool's
// sessionCheckpoint) has its state saved to the snapshot store after its
// runs, at most once per interval, by a loop of this process that follows
// it while it is Ready on one pod:
//
//   - The loop waits at its agent (GET /v1/quiet) for a run to end, so a
//     checkpoint costs the run nothing: its answer has gone to the caller
//     before the checkpoint starts. A run sent while a checkpoint pickles the
//     state waits for the pickling (the agent holds it rather than refuse
//     it); the upload does not hold the interpreter.
//   - Each checkpoint goes to the store under a new key that says when it was
//     taken and which run it is the state after; the older ones are deleted
//     after it. No API write is made for it: the Session's status.checkpoint
//     is written with its activity, at most every sessionStatusInterval, and
//     the store, not the status, says which checkpoint is the last.
//   - The loop's first checkpoint is taken as soon as the Session is Ready
//     on its pod (its context applied, or its state restored), so a Session
//     lost before its first run still has one.
//
// When a durable Session's pod or node is lost (recover), its newest
// snapshot in the store is restored on another pod, as a move restores
// one, and its next run's result says which run its state is from
// (moved.run, moved.checkpoint): the runs after it are the caller's to redo.
// Only the leader runs the loops (the reconciler does); a suspend, a move or
// the Session's end stops its loop, and waits for it, before it writes the
// store itself, so a late checkpoint never deletes the suspend's snapshot.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

const (
	// quietWait is how long one wait at the agent for a run to end lasts.
	quietWait = 30 * time.Second
	// checkpointRetry is how soon a checkpoint that failed is tried again.
	checkpointRetry = 10 * time.Second
	// checkpointTimeout bounds one checkpoint (snapshot and upload).
	checkpointTimeout = 2 * time.Minute
	// cacheLag is how long a new loop waits for the cache to show the
	// Session Ready on its pod.
	cacheLag = 5 * time.Second
	// minCheckpointGap spaces checkpoints whatever the interval: the agent
	// shares its container with the code, and one that says "quiet" at once,
	// again and again, must not keep the manager uploading snapshots.
	minCheckpointGap = 250 * time.Millisecond
)

// checkpointPolicy is the Session's checkpoint policy, or nil when it is not durable.
func checkpointPolicy(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool) *sandboxv1alpha1.SessionCheckpointPolicy {
	if ses.Spec.Checkpoint != nil {
		return ses.Spec.Checkpoint
	}
	if pool != nil {
		return pool.Spec.SessionCheckpoint
	}
	return nil
}

func checkpointInterval(p *sandboxv1alpha1.SessionCheckpointPolicy) time.Duration {
	if p == nil || p.Interval == nil {
		return 0
	}
	return p.Interval.Duration
}

// checkpointLoops are the loops of the Sessions this process checkpoints.
// Only reconciles start them, and those run only while the manager leads;
// Start ends them all when the manager stops.
type checkpointLoops struct {
	mu      sync.Mutex
	base    context.Context
	stopAll context.CancelFunc
	loops   map[types.NamespacedName]*checkpointLoop
}

func newCheckpointLoops() *checkpointLoops {
	base, stop := context.WithCancel(context.Background())
	return &checkpointLoops{base: base, stopAll: stop, loops: map[types.NamespacedName]*checkpointLoop{}}
}

// checkpointLoop follows one Session on one pod.
type checkpointLoop struct {
	pod    types.UID
	cancel context.CancelFunc
	done   chan struct{}
	// last is the last checkpoint it stored; wokeAt when it last woke (or
	// will next wake) the Session to write it into its status.
	last   atomic.Pointer[sandboxv1alpha1.SessionSnapshot]
	wokeAt time.Time
}

// Start waits for the manager to stop, then stops every loop and waits for them.
func (c *checkpointLoops) Start(ctx context.Context) error {
	<-ctx.Done()
	c.mu.Lock()
	c.stopAll()
	loops := c.loops
	c.loops = map[types.NamespacedName]*checkpointLoop{}
	c.mu.Unlock()
	for _, l := range loops {
		<-l.done
	}
	return nil
}

// keepCheckpoints makes sure a loop follows the Ready Session ses on pod
// when it is durable, and none when it is not.
func (r *Reconciler) keepCheckpoints(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) {
	key := client.ObjectKeyFromObject(ses)
	policy := checkpointPolicy(ses, pool)
	if policy == nil || r.Snapshots == nil {
		r.stopCheckpoints(key)
		return
	}
	c := r.checkpoints
	c.mu.Lock()
	l, ok := c.loops[key]
	if ok && l.pod == pod.UID {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if ok {
		r.stopCheckpoints(key) // it followed the Session's pod before this one
	}
	lctx, cancel := context.WithCancel(logf.IntoContext(c.base, logf.FromContext(ctx)))
	l = &checkpointLoop{pod: pod.UID, cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if _, raced := c.loops[key]; raced || c.base.Err() != nil {
		c.mu.Unlock()
		cancel()
		return
	}
	c.loops[key] = l
	c.mu.Unlock()
	go r.checkpointLoop(lctx, key, l, checkpointInterval(policy))
}

// stopCheckpoints stops the Session's loop and waits until it has: after
// it, nothing of this process writes a checkpoint of the Session.
func (r *Reconciler) stopCheckpoints(key types.NamespacedName) {
	c := r.checkpoints
	c.mu.Lock()
	l, ok := c.loops[key]
	delete(c.loops, key)
	c.mu.Unlock()
	if ok {
		l.cancel()
		<-l.done
	}
}

// lastCheckpoint is the last checkpoint the Session's loop stored, or nil.
func (r *Reconciler) lastCheckpoint(key types.NamespacedName) *sandboxv1alpha1.SessionSnapshot {
	c := r.checkpoints
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.loops[key]; ok {
		return l.last.Load()
	}
	return nil
}

func (r *Reconciler) checkpointLoop(ctx context.Context, key types.NamespacedName, l *checkpointLoop, interval time.Duration) {
	defer close(l.done)
	log := logf.FromContext(ctx).WithValues("session", key.String())
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	started := time.Now()
	lastRun := int64(-1) // none taken on this pod yet: take one now
	var lastAt time.Time
	for ctx.Err() == nil {
		ses, pod, pool, ok := r.checkpointTarget(ctx, key, l.pod)
		if !ok {
			// A loop started with the Ready status just stored may read a
			// cache that has not seen it yet; past that, the Session is not
			// Ready on that pod any more, and its reconcile decides what follows.
			if time.Since(started) < cacheLag && sleep(20*time.Millisecond) {
				continue
			}
			return
		}
		agent, err := r.Gate.Open(ctx, pool, pod, agentgate.ForSession(ses))
		if err != nil {
			log.V(1).Info("cannot reach the agent for a checkpoint", "err", err.Error())
			if !sleep(checkpointRetry) {
				return
			}
			continue
		}
		if lastRun >= 0 {
			q, err := agent.Quiet(ctx, lastRun, quietWait)
			if err != nil {
				if ctx.Err() == nil {
					log.V(1).Info("waiting for a run to end failed", "err", err.Error())
				}
				if !sleep(checkpointRetry) {
					return
				}
				continue
			}
			if !q.Quiet || q.Runs <= lastRun {
				continue
			}
			// At most one per interval: the state saved is the one after
			// the last run before it ends.
			if d := max(interval, minCheckpointGap) - r.Clock.Since(lastAt); d > 0 && !sleep(d) {
				return
			}
		}
		ck, err := r.checkpoint(ctx, ses, pod, agent)
		switch {
		case err == nil:
			lastRun, lastAt = ck.Run, r.Clock.Now()
			l.last.Store(ck)
			r.wakeForStatus(key, l)
		case ctx.Err() != nil:
			return
		case agentgate.IsStatus(err, http.StatusConflict):
			// A run held the interpreter past the agent's wait, or a suspend
			// sealed it: wait for the run to end (or the loop to be stopped).
			if lastRun < 0 {
				lastRun = 0
			}
			if !sleep(time.Second) {
				return
			}
		default:
			metrics.SessionCheckpoint.WithLabelValues("failed").Observe(0)
			log.Info("checkpoint failed; trying again", "err", err.Error(), "retryIn", checkpointRetry.String())
			r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, sandboxv1alpha1.ReasonCheckpointFailed, "Checkpoint",
				"could not save the Session's state: %v; trying again in %s", err, checkpointRetry)
			if !sleep(checkpointRetry) {
				return
			}
		}
	}
}

// wakeForStatus has the Session's reconcile write its new checkpoint into
// its status within sessionStatusInterval: at once when it has not been
// woken for that long, else when that long has passed (one wake-up waits at
// a time), never a write per run.
func (r *Reconciler) wakeForStatus(key types.NamespacedName, l *checkpointLoop) {
	if r.Wakeups == nil {
		return
	}
	now := time.Now() // rations wake-ups: not a policy of the Session's
	next := l.wokeAt.Add(sessionStatusInterval)
	switch {
	case !now.Before(next):
		l.wokeAt = now
		r.Wakeups.Wake(key)
	case !l.wokeAt.After(now):
		l.wokeAt = next
		time.AfterFunc(next.Sub(now), func() { r.Wakeups.Wake(key) })
	}
}

// checkpointTarget reads the Session, its pod and its pool from the cache:
// ok only while the Session is Ready on the pod the loop follows.
func (r *Reconciler) checkpointTarget(ctx context.Context, key types.NamespacedName, podUID types.UID) (*sandboxv1alpha1.Session, *corev1.Pod, *sandboxv1alpha1.SandboxPool, bool) {
	ses := &sandboxv1alpha1.Session{}
	if err := r.Get(ctx, key, ses); err != nil || ses.Status.Phase != sandboxv1alpha1.SessionReady || ses.Status.PodUID != podUID {
		return nil, nil, nil, false
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, ses.PodKey(), pod); err != nil || pod.UID != podUID {
		return nil, nil, nil, false
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, ses.PoolKey(), pool); err != nil {
		pool = nil
	}
	return ses, pod, pool, true
}

// checkpoint saves the Session's state to the store without sealing its
// pod, and deletes its older snapshots.
func (r *Reconciler) checkpoint(ctx context.Context, ses *sandboxv1alpha1.Session, pod *corev1.Pod, agent *agentgate.Agent) (*sandboxv1alpha1.SessionSnapshot, error) {
	start := time.Now() // a measurement, not a decision
	hold, err := r.Memory.Acquire("checkpoint", ses.Namespace, 0)
	if err != nil {
		return nil, err
	}
	defer hold.Release()
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	body, _, err := agent.Snapshot(ctx, agentgate.SnapshotOptions{Checkpoint: true, Workspace: true, MaxBytes: r.Snapshots.MaxBytes()})
	if err != nil {
		return nil, fmt.Errorf("snapshot of pod %s: %w", pod.Name, err)
	}
	chunks, err := hold.ReadAll(body, snapshot.MaxSize(r.Snapshots.MaxBytes()))
	_ = body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the snapshot of pod %s: %w", pod.Name, err)
	}
	n := chunks.Len()
	if err := hold.Grow(2 * n); err != nil {
		return nil, err
	}
	data := make([]byte, 0, n)
	for _, c := range chunks {
		data = append(data, c...)
	}
	hold.Shrink(2 * n)
	m, err := snapshot.ReadHeader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if !controllerutil.ContainsFinalizer(ses, SnapshotFinalizer) {
		// Its snapshots go with it: the one write a durable Session's checkpoints cost.
		orig := ses.DeepCopy()
		controllerutil.AddFinalizer(ses, SnapshotFinalizer)
		if err := r.Patch(ctx, ses, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return nil, fmt.Errorf("add the snapshot finalizer to session %s: %w", ses.Name, err)
		}
	}
	key, err := r.Snapshots.PutCheckpoint(ctx, owner(ses), m.Runs, data)
	if err != nil {
		return nil, err
	}
	if ctx.Err() == nil {
		if err := r.Snapshots.DeleteAll(ctx, owner(ses), key); err != nil {
			logf.FromContext(ctx).Info("could not delete older snapshots; the next checkpoint tries again", "err", err.Error())
		}
	}
	took := time.Since(start)
	metrics.SessionCheckpoint.WithLabelValues("stored").Observe(took.Seconds())
	metrics.SessionCheckpointBytes.Observe(float64(len(data)))
	st := snapshotStatus(key, int64(len(data)), m, metav1.NewTime(r.Clock.Now()))
	st.Run = m.Runs
	logf.FromContext(ctx).V(4).Info("checkpoint stored", "run", m.Runs, "bytes", len(data), "took", took.String())
	return st, nil
}

// recoverable reports whether a Session whose pod or node is lost resumes
// from a checkpoint instead of ending Lost.
func (r *Reconciler) recoverable(ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool) bool {
	return r.Snapshots != nil && checkpointPolicy(ses, pool) != nil
}

// recoverOrLose resumes a durable Session whose pod or node was lost (why,
// reason) from its newest snapshot in the store, on another pod; a Session
// that is not durable, or has none, ends Lost as before (its message why
// and lost). fromNode is where it was ("" when its pod is gone).
func (r *Reconciler) recoverOrLose(ctx context.Context, ses *sandboxv1alpha1.Session, pool *sandboxv1alpha1.SandboxPool,
	fromNode, reason, why, lost string) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(ses)
	r.stopCheckpoints(key)
	if !r.recoverable(ses, pool) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, reason, why+lost)
	}
	latest, err := r.Snapshots.Latest(ctx, owner(ses))
	if errors.Is(err, snapshotstore.ErrNotFound) {
		return r.end(ctx, ses, sandboxv1alpha1.SessionLost, reason, why+"; it had no checkpoint yet")
	}
	if err != nil {
		// The store did not answer: the Session stays as it is, and is looked at again.
		return ctrl.Result{}, fmt.Errorf("find the last checkpoint of session %s: %w", ses.Name, err)
	}
	now := metav1.NewTime(r.Clock.Now())
	ck := &sandboxv1alpha1.SessionSnapshot{Key: latest.Key, Bytes: latest.Bytes, Run: latest.Run, Time: metav1.NewTime(latest.Time)}
	fromPod := ses.Status.PodName
	ses.Status.Phase = sandboxv1alpha1.SessionSuspended
	ses.Status.PodName, ses.Status.PodUID, ses.Status.Interpreter = "", "", ""
	ses.Status.Snapshot = ck.DeepCopy()
	ses.Status.Checkpoint = ck.DeepCopy()
	ses.Status.LastMove = &sandboxv1alpha1.SessionMove{FromNode: fromNode, Reason: reason, StartTime: now, Checkpoint: ck}
	r.mu.Lock()
	r.moveBegun[ses.UID] = now.Time
	r.mu.Unlock()
	msg := fmt.Sprintf("%s; it resumes on another pod from its checkpoint after run %d (taken %s): the runs after it are to be redone",
		why, ck.Run, ck.Time.UTC().Format(time.RFC3339))
	r.setReady(ses, metav1.ConditionFalse, sandboxv1alpha1.ReasonRecovering, msg)
	if err := r.Status().Update(ctx, ses); err != nil {
		return ctrl.Result{}, fmt.Errorf("store the Recovering status of session %s: %w", ses.Name, err)
	}
	r.mu.Lock()
	delete(r.statusWritten, ses.UID)
	r.mu.Unlock()
	r.Dispatcher.UpdateSession(ses)
	r.Recorder.Eventf(ses, nil, corev1.EventTypeWarning, sandboxv1alpha1.ReasonRecovering, "Recover",
		"Pod %s lost (%s): resuming from the checkpoint after run %d", fromPod, reason, ck.Run)
	res, err := r.free(ctx, ses)
	// The resume follows at once: nothing else wakes a Suspended Session.
	res.RequeueAfter = time.Millisecond
	return res, err
}
