package lease

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// storedPoolAndPod are a pool and one of its pods as the API server returns
// them: with UIDs, a generation and a resourceVersion, so answers are kept.
func storedPoolAndPod() (*sandboxv1alpha1.SandboxPool, *corev1.Pod) {
	pool := wrappers.Pool("ns", "python").Obj()
	pool.UID, pool.Generation = "pool-uid", 1
	pool.Spec.RuntimeClassName = ptr.To("gvisor")
	p := builtPod(pool)
	p.UID, p.ResourceVersion = "pod-uid", "10"
	return pool, p
}

// A kept answer must never outlive the pod, pool or key it was given for:
// someone with pod rights patching a warm pod's image gets a new
// resourceVersion, and the pod is judged again.
func TestConformanceIsJudgedAgainForAnyChange(t *testing.T) {
	ring := keys{"k1": "k1=PUBLIC"}
	pool, pod := storedPoolAndPod()
	if err := Admits(pool, pod, ring); err != nil {
		t.Fatalf("a pod the pool built: %v", err)
	}
	patched := pod.DeepCopy()
	patched.Spec.Containers[0].Image, patched.ResourceVersion = "tenant/agent:1", "11"
	if err := Admits(pool, patched, ring); err == nil {
		t.Fatal("a pod whose image was patched (a new resourceVersion) was admitted from the kept answer")
	}
	newSpec := pool.DeepCopy()
	newSpec.Spec.Image, newSpec.Generation = "warmpool.dev/repl:next", 2
	if err := Admits(newSpec, pod, ring); err == nil {
		t.Fatal("a pod of the old image was admitted after the pool's spec changed (a new generation)")
	}
	if err := Admits(pool, pod, keys{"k1": "k1=ROTATED"}); err == nil {
		t.Fatal("a pod trusting a key the manager no longer signs with was admitted from the kept answer")
	}
	if err := Admits(pool, pod, ring); err != nil {
		t.Errorf("the unchanged pod again: %v", err)
	}
}

// BenchmarkAdmits compares judging a pod each time with a kept answer (the
// pool reconciler asks of every pod of the pool on each reconcile).
func BenchmarkAdmits(b *testing.B) {
	ring := keys{"k1": "k1=PUBLIC"}
	pool, pod := storedPoolAndPod()
	b.Run("judged", func(b *testing.B) {
		for b.Loop() {
			if err := sandboxpod.Conforms(pod, pool, "k1=PUBLIC"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kept", func(b *testing.B) {
		for b.Loop() {
			if err := Admits(pool, pod, ring); err != nil {
				b.Fatal(err)
			}
		}
	})
}
