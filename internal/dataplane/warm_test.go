package dataplane

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// noAPIReads fails a test that reads kube-apiserver.
type noAPIReads struct{ t *testing.T }

func (r noAPIReads) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	r.t.Error("kube-apiserver was read")
	return nil
}

func (r noAPIReads) List(context.Context, client.ObjectList, ...client.ListOption) error {
	r.t.Error("kube-apiserver was read")
	return nil
}

// informersStarted stands for the manager's informers: resolveCached only
// needs to know events are delivered (sessionChanges is fed by the test).
type informersStarted struct{ cache.Informers }

type resolved struct {
	t    *target
	code int
	msg  string
}

// A run sent the moment its caller saw the Session Ready can reach a
// replica whose cache has not heard of the lease yet, nor of the pod's
// claim written beside it. It is served from the cache as each event
// arrives, without a read of kube-apiserver and without a poll's sleep.
func TestARunAheadOfTheCacheIsServedWhenTheInformerHears(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{sandboxv1alpha1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	pool := &sandboxv1alpha1.SandboxPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "python"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "python-1", UID: "pod-1",
		Labels: map[string]string{sandboxpod.LabelPool: "python", sandboxpod.LabelState: sandboxpod.StateIdle}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "ses-1"},
		Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.PoolReference{Name: "python"}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool, pod, ses).WithStatusSubresource(ses).Build()
	s := &Server{Client: c, APIReader: noAPIReads{t}, Informers: informersStarted{}, cacheLag: time.Minute}

	answer := make(chan resolved, 1)
	go func() {
		tg, code, _, msg := s.resolveCached(ctx, "ns", "s")
		answer <- resolved{tg, code, msg}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	subscribed := func() bool {
		s.ready.mu.Lock()
		defer s.ready.mu.Unlock()
		return len(s.ready.waiting[client.ObjectKeyFromObject(ses)]) == 1
	}
	waitFor("the request waits on the Session", subscribed)

	// The informer hears of Ready first; the claim is not in yet.
	ses.Status = sandboxv1alpha1.SessionStatus{Phase: sandboxv1alpha1.SessionReady, PodName: pod.Name, PodUID: pod.UID}
	if err := c.Status().Update(ctx, ses); err != nil {
		t.Fatal(err)
	}
	s.ready.changed(ses)
	waitFor("the request waits again, for the claim", subscribed)
	select {
	case got := <-answer:
		t.Fatalf("answered before the claim was in the cache: %d %s", got.code, got.msg)
	default:
	}

	// Then of the claim.
	if err := lease.ClaimForSession(ctx, c, pod, ses, time.Now()); err != nil {
		t.Fatal(err)
	}
	s.ready.podChanged(pod)
	select {
	case got := <-answer:
		if got.t == nil || got.t.pod.UID != pod.UID {
			t.Fatalf("want the Session's pod, got %d %s", got.code, got.msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's event did not serve the request")
	}
}

// A Session that really is Pending is refused as Pending once the cache has
// had its moment, and one that is gone as not found: the wait is bounded.
func TestARunForAPendingSessionIsRefusedAfterTheCacheLag(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ses).Build()
	s := &Server{Client: c, Informers: informersStarted{}, cacheLag: 20 * time.Millisecond}
	_, code, _, msg := s.resolveCached(context.Background(), "ns", "s")
	if code != http.StatusConflict || !strings.Contains(msg, "is Pending") {
		t.Fatalf("want 409 Pending, got %d %s", code, msg)
	}
	_, code, _, msg = s.resolveCached(context.Background(), "ns", "other")
	if code != http.StatusNotFound {
		t.Fatalf("want 404, got %d %s", code, msg)
	}
	if len(s.ready.waiting) != 0 {
		t.Fatalf("the requests that gave up still wait: %v", s.ready.waiting)
	}
}
