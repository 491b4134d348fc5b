package execution

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// Regression (issue 10, item 7): retryOnConflict retried any error, re-reading
// the pod and writing again after errors that a retry cannot fix.
func TestRetryOnConflictRetriesConflictsOnly(t *testing.T) {
	pod := wrappers.Pod("ns", "p", "python").Obj()
	c := fake.NewClientBuilder().WithObjects(pod.DeepCopy()).Build()
	r := &Reconciler{APIReader: c}
	ctx := context.Background()

	calls := 0
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("no"))
	err := r.retryOnConflict(ctx, pod, func(*corev1.Pod) error { calls++; return forbidden })
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("a non-conflict error: %v after %d calls, want it returned after 1", err, calls)
	}

	calls = 0
	err = r.retryOnConflict(ctx, pod, func(p *corev1.Pod) error {
		calls++
		if calls < 3 {
			return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errors.New("changed"))
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("conflicts: %v after %d calls, want success on the third", err, calls)
	}
}
