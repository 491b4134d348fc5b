package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func readyPod(name string, labels map[string]string) *corev1.Pod {
	l := map[string]string{sandboxpod.LabelPool: "python", sandboxpod.LabelState: sandboxpod.StateIdle}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: l},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func newClient(objs ...client.Object) client.Client {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = sandboxv1alpha1.AddToScheme(s)
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func exec(name, session string) *sandboxv1alpha1.Execution {
	ex := wrappers.Execution("ns", name).Session(session).Obj()
	ex.UID = types.UID(name + "-uid")
	return ex
}

// Two managers read the same idle pod; only the first claim may win.
func TestSecondClaimOfTheSamePodConflicts(t *testing.T) {
	ctx := context.Background()
	c := newClient(readyPod("p1", nil))
	var a, b corev1.Pod
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p1"}, &a)
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p1"}, &b)
	if err := Claim(ctx, c, &a, exec("first", "")); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	err := Claim(ctx, c, &b, exec("second", ""))
	if !apierrors.IsConflict(err) {
		t.Fatalf("second claim of a stale copy: %v, want a conflict", err)
	}
	var got corev1.Pod
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p1"}, &got)
	if ClaimedBy(&got) != "first-uid" || got.Labels[sandboxpod.LabelState] != sandboxpod.StateBusy {
		t.Fatalf("pod after claims: %v %v", got.Labels, got.Annotations)
	}
	// A fresh read shows it busy: not claimable at all.
	if err := Claim(ctx, c, &got, exec("third", "")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("claim of a busy pod: %v", err)
	}
}

func TestSessionPodIsOnlyForItsSession(t *testing.T) {
	ctx := context.Background()
	c := newClient(readyPod("p1", nil))
	var pod corev1.Pod
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p1"}, &pod)
	first := exec("s-1", "alice")
	if err := Claim(ctx, c, &pod, first); err != nil {
		t.Fatal(err)
	}
	if err := Claim(ctx, c, &pod, exec("s-2", "alice")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("claim while the session's previous execution runs: %v", err)
	}
	if err := ReleaseToSession(ctx, c, &pod, first, metav1.Now().Time); err != nil {
		t.Fatal(err)
	}
	if err := Claim(ctx, c, &pod, exec("b-1", "bob")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("another session took alice's pod: %v", err)
	}
	if err := Claim(ctx, c, &pod, exec("x", "")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("a session-less execution took alice's pod: %v", err)
	}
	if err := Claim(ctx, c, &pod, exec("s-2", "alice")); err != nil {
		t.Fatalf("alice's next execution: %v", err)
	}
}

func TestUnreadyOrTerminatingPodsAreNotClaimable(t *testing.T) {
	ctx := context.Background()
	unready := readyPod("p1", nil)
	unready.Status.Conditions = nil
	if err := Claim(ctx, newClient(unready), unready, exec("e", "")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("unready: %v", err)
	}
	failed := readyPod("p2", nil)
	failed.Status.Phase = corev1.PodFailed
	if err := Claim(ctx, newClient(failed), failed, exec("e", "")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("failed: %v", err)
	}
}

// A FreshInterpreter pod is unclaimable from the end of its Execution until its
// interpreter was replaced, and only the Execution that held it can release it.
func TestResettingPodIsNotClaimableUntilReturned(t *testing.T) {
	ctx := context.Background()
	c := newClient(readyPod("p1", nil))
	var pod corev1.Pod
	_ = c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "p1"}, &pod)
	first := exec("first", "")
	if err := Claim(ctx, c, &pod, first); err != nil {
		t.Fatal(err)
	}
	if err := ReleaseForReset(ctx, c, &pod, exec("other", ""), time.Now()); err != nil || ClaimedBy(&pod) != first.UID {
		t.Fatalf("an Execution that does not hold the pod released it: %v, claimed by %q", err, ClaimedBy(&pod))
	}
	start := time.Now()
	if err := ReleaseForReset(ctx, c, &pod, first, start); err != nil {
		t.Fatal(err)
	}
	if ClaimedBy(&pod) != "" || pod.Labels[sandboxpod.LabelState] != sandboxpod.StateResetting {
		t.Fatalf("after release: claimed by %q, state %q", ClaimedBy(&pod), pod.Labels[sandboxpod.LabelState])
	}
	if since, ok := ResetSince(&pod); !ok || !since.Equal(start.UTC()) {
		t.Fatalf("ResetSince = %v, %v; want %v", since, ok, start.UTC())
	}
	if err := Claim(ctx, c, &pod, exec("next", "")); !errors.Is(err, ErrNotClaimable) {
		t.Fatalf("a resetting pod was claimed: %v", err)
	}
	if err := ReturnToPool(ctx, c, &pod); err != nil {
		t.Fatal(err)
	}
	if _, ok := ResetSince(&pod); ok || pod.Annotations[sandboxpod.AnnotationResetSince] != "" {
		t.Fatalf("still resetting after ReturnToPool: %v", pod.Labels)
	}
	if err := Claim(ctx, c, &pod, exec("next", "")); err != nil {
		t.Fatalf("the returned pod is not claimable: %v", err)
	}
	if err := ReturnToPool(ctx, c, &pod); err != nil || ClaimedBy(&pod) == "" {
		t.Fatalf("ReturnToPool freed a busy pod: %v", err)
	}
}
