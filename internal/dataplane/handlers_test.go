package dataplane

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// A reset records the Session's interpreter twice; other writes of the
// Session in between (its activity) must not fail it, an overlapping reset must.
func TestSetInterpreterRetriesOtherWritesButNotAnotherReset(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "u1"},
		Status: sandboxv1alpha1.SessionStatus{Phase: sandboxv1alpha1.SessionReady, PodName: "p", Interpreter: "old"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ses).WithStatusSubresource(ses).Build()
	s := &Server{Client: c, APIReader: c}
	read := func() *sandboxv1alpha1.Session {
		got := &sandboxv1alpha1.Session{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(ses), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	stale := read()
	activity := read()
	activity.Status.Runs = 7 // the Session controller's write, after the data plane read the Session
	if err := c.Status().Update(ctx, activity); err != nil {
		t.Fatal(err)
	}
	if err := s.setInterpreter(ctx, stale, "old", ""); err != nil {
		t.Fatalf("a write of the activity in between must not fail the reset: %v", err)
	}
	if got := read(); got.Status.Interpreter != "" || got.Status.Runs != 7 {
		t.Fatalf("want the interpreter cleared and the activity kept, got %+v", got.Status)
	}

	mine := read()
	other := read()
	other.Status.Interpreter = "theirs" // an overlapping reset recorded its interpreter first
	if err := c.Status().Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	err := s.setInterpreter(ctx, mine, "", "mine")
	if !apierrors.IsConflict(err) {
		t.Fatalf("an overlapping reset must fail this one with a conflict, got %v", err)
	}
	if got := read(); got.Status.Interpreter != "theirs" {
		t.Fatalf("the other reset's interpreter must stand, got %q", got.Status.Interpreter)
	}
}
