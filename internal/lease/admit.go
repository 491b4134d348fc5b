package lease

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// Anyone who may create pods in a namespace can give a pod a pool's labels,
// and annotations that look like a lease. A lease is only ever given on a pod
// the pool controls and that is built as the pool builds its pods; the rest
// are not the pool's, whatever their labels say: they get no code, no token
// and no deletion from the manager.

// ErrNotOwned: the pod's controller is not the pool.
var ErrNotOwned = errors.New("the pod is not controlled by the pool")

// Keys is what admission asks of the manager's signing keys
// (agentauth.Keyring).
type Keys interface {
	// Loaded reports whether the keys were read yet.
	Loaded() bool
	// Trusted returns the --trusted-keys value of a pod started with keyID,
	// false when the manager no longer has that key.
	Trusted(keyID string) (string, bool)
}

// Owned reports whether pod's controller is pool: an owner reference with the
// pool's UID. The pool deletes only the pods it owns.
func Owned(pod *corev1.Pod, pool *sandboxv1alpha1.SandboxPool) bool {
	ref := metav1.GetControllerOfNoCopy(pod)
	return ref != nil && ref.UID == pool.UID && ref.Kind == "SandboxPool" &&
		ref.APIVersion == sandboxv1alpha1.GroupVersion.String()
}

// MayServe returns nil when pod may serve a run: a pod held by a session (its
// lease was admitted when it was given) while the pool owns it and the
// manager has its key, so that a change of the pool's image or spec does not
// strand a Session on its pod; any other pod only if Admits.
func MayServe(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, keys Keys) error {
	if Session(pod) == "" {
		return Admits(pool, pod, keys)
	}
	return MayKeep(pool, pod, keys)
}

// MayKeep returns nil when a pod that was admitted when it was given (to a
// Session, or to an Execution that recorded its UID) may go on serving it:
// the pool still owns it and the manager still has its key. A change of the
// pool's image or spec since does not strand its holder on it.
func MayKeep(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, keys Keys) error {
	if !Owned(pod, pool) {
		return ErrNotOwned
	}
	_, err := trustedKey(pod, keys)
	return err
}

// trustedKey returns the --trusted-keys value of the pod's key ID, "" while
// the keys are not loaded, and an error when the manager no longer has it.
func trustedKey(pod *corev1.Pod, keys Keys) (string, error) {
	if keys == nil || !keys.Loaded() {
		return "", nil
	}
	trusted, ok := keys.Trusted(pod.Labels[sandboxpod.LabelAgentKey])
	if !ok {
		return "", fmt.Errorf("the manager has no key %q, which the pod's agent trusts", pod.Labels[sandboxpod.LabelAgentKey])
	}
	return trusted, nil
}

// Admits returns nil when pod may be leased as one of pool's sandboxes: the
// pool owns it, it is built as the pool builds its pods, and its agent trusts
// a key the manager signs with. Until the keys are loaded the key is not
// checked (no call can be signed before then anyway).
func Admits(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, keys Keys) error {
	if !Owned(pod, pool) {
		return ErrNotOwned
	}
	trusted, err := trustedKey(pod, keys)
	if err != nil {
		return err
	}
	if err := conforms.check(pod, pool, trusted); err != nil {
		return fmt.Errorf("the pod is not built as pool %s builds its pods: %w", pool.Name, err)
	}
	return nil
}
