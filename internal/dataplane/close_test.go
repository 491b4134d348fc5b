package dataplane

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// The close a one-call run sends as it ends is for its own Session: one that
// someone deleted and made again under the same name meanwhile is not closed
// by it. Against a real API server: the precondition is the server's.
func TestClosingAOneCallSessionSparesOneMadeAgainUnderItsName(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd")
	}
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	c := env.Client
	s := &Server{Client: c, Log: logr.Discard()}
	mk := func() *sandboxv1alpha1.Session {
		ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "run-1"},
			Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.ParsePoolReference("python")}}
		if err := c.Create(ctx, ses); err != nil {
			t.Fatal(err)
		}
		return ses
	}
	closed := func(ses *sandboxv1alpha1.Session) bool {
		got := &sandboxv1alpha1.Session{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(ses), got); err != nil {
			t.Fatal(err)
		}
		return got.Spec.Close
	}

	mine := mk()
	if err := c.Delete(ctx, mine); err != nil {
		t.Fatal(err)
	}
	theirs := mk()
	s.closeSession(ctx, mine.DeepCopy())
	if closed(theirs) {
		t.Fatal("the close of a one-call run closed another Session made under its name")
	}
	s.closeSession(ctx, theirs.DeepCopy())
	if !closed(theirs) {
		t.Fatal("the close did not close the Session it was for")
	}
}
