package execution

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/recycle"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The disposition policy: a finished Execution's status says what becomes of
// its pod (status.podDisposition), and dispose carries it out, only after that
// status is stored and only while the pod is still claimed by the Execution.
// It is idempotent: the reconcile that wrote the final status calls it, and
// so does every later reconcile of the finished Execution, so a manager that
// stopped in between finishes the job when it comes back. A pod claimed by
// someone else is never touched.

// dispose carries out ex's pod disposition.
func (r *Reconciler) dispose(ctx context.Context, ex *sandboxv1alpha1.Execution) error {
	if ex.Status.PodName == "" || r.disposed.has(ex.UID, r.now()) {
		return nil
	}
	done, err := r.disposeOnce(ctx, ex)
	if done {
		r.disposed.add(ex.UID, r.now())
	}
	return err
}

// disposeOnce carries out ex's pod disposition; done: nothing is left to do
// (a reset under way says so itself, when it ends).
func (r *Reconciler) disposeOnce(ctx context.Context, ex *sandboxv1alpha1.Execution) (done bool, err error) {
	holds := func(pod *corev1.Pod) bool {
		return lease.ClaimedBy(pod) == ex.UID && (ex.Status.PodUID == "" || pod.UID == ex.Status.PodUID)
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, ex.PodKey(), pod); (err != nil && !apierrors.IsNotFound(err)) || (err == nil && holds(pod)) {
		if err != nil {
			return false, err
		}
	} else {
		// The cache does not show the claim: done already, the pod someone
		// else's (another pod made under its name is never the Execution's),
		// or the cache is behind the claim itself (a run shorter than the
		// claim's watch event). Asked around it.
		if err := r.APIReader.Get(ctx, ex.PodKey(), pod); err != nil {
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}
		if !holds(pod) {
			return true, nil
		}
	}
	switch ex.Status.PodDisposition {
	case sandboxv1alpha1.DispositionReleaseToSession:
		err := r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error { return lease.ReleaseToSession(ctx, r.Client, p, ex, r.now()) })
		return err == nil, err
	case sandboxv1alpha1.DispositionReset:
		// A new interpreter takes about a second under gVisor: replace it off
		// the request path, under the Execution's claim, and release the pod
		// once, when it is done. One reset per pod at a time: every
		// reconcile of the finished Execution comes here meanwhile.
		if _, busy := r.resets.LoadOrStore(pod.UID, struct{}{}); busy {
			return false, nil
		}
		go func(ex *sandboxv1alpha1.Execution) {
			defer r.resets.Delete(ex.Status.PodUID)
			if recycle.Claimed(logf.FromContext(ctx).WithValues("pod", ex.Status.PodName), r.Client, r.APIReader, r.Gate, ex) {
				r.disposed.add(ex.UID, r.now())
				return
			}
			// The pod still carries the finished Execution's claim (its release
			// failed for ResetTimeout, or its delete failed), and nothing else
			// frees it: the Execution looks again, which resets it again.
			time.AfterFunc(resetRetry, func() { r.Wakeups.Wake(client.ObjectKeyFromObject(ex)) })
		}(ex.DeepCopy())
		return false, nil
	default: // Delete, and Executions finished before dispositions were recorded
		err := r.deleteClaimedPod(ctx, pod, ex.UID)
		return err == nil, err
	}
}

// deleteClaimedPod deletes a pod as long as the Execution with this UID still
// holds it: the preconditions make the API server refuse when the pod
// changed since it was read, and then the pod is read again.
func (r *Reconciler) deleteClaimedPod(ctx context.Context, pod *corev1.Pod, uid types.UID) error {
	if !r.ownedByItsPool(ctx, pod) {
		// A pod that only carries the claim: never the manager's to delete.
		logf.FromContext(ctx).Info("not deleting a pod its pool does not own", "pod", pod.Name)
		return nil
	}
	return r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error {
		if lease.ClaimedBy(p) != uid || p.DeletionTimestamp != nil {
			// Someone else's, or on its way out already: every later
			// reconcile of the Execution comes here, and a pod that takes its
			// grace period to go would be deleted again each time.
			return nil
		}
		err := r.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", p.Name, err)
		}
		return nil
	})
}

// retryOnConflict applies a pod update (see retryPodUpdate).
func (r *Reconciler) retryOnConflict(ctx context.Context, pod *corev1.Pod, update func(*corev1.Pod) error) error {
	return recycle.RetryPodUpdate(ctx, r.APIReader, pod, update)
}

// ownedByItsPool reports whether the pool the pod's label names controls it.
func (r *Reconciler) ownedByItsPool(ctx context.Context, pod *corev1.Pod) bool {
	pool := &sandboxv1alpha1.SandboxPool{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}, pool); err != nil {
		return false
	}
	return lease.Owned(pod, pool)
}

// recentlyDisposed remembers for a while the Executions whose pod
// disposition this manager carried out: every later reconcile of a finished
// Execution comes to dispose, and the cache may not show the first one's
// write yet (a second delete, a release refused as a conflict, are API
// requests for nothing).
type recentlyDisposed struct {
	mu sync.Mutex
	at map[types.UID]time.Time
}

// resetRetry is how long after a reset whose release failed the Execution
// tries again.
const resetRetry = time.Second

// disposedMemory is how long a disposition is remembered: far longer than
// the cache lags.
const disposedMemory = time.Minute

func (d *recentlyDisposed) has(uid types.UID, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.at[uid]
	return ok && now.Sub(t) < disposedMemory
}

func (d *recentlyDisposed) add(uid types.UID, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at == nil {
		d.at = map[types.UID]time.Time{}
	}
	if len(d.at) >= 1024 {
		for k, t := range d.at {
			if now.Sub(t) >= disposedMemory {
				delete(d.at, k)
			}
		}
	}
	d.at[uid] = now
}
