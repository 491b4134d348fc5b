package session

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	agentclient "github.com/warmpool/warmpool/internal/agent/client"
)

// A Session that cannot move off a drained node says why, once per reason:
// over the snapshot limit (the agent's 413), no store, a store that failed.
func TestUnmovableSaysWhy(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "u1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ses).WithStatusSubresource(ses).Build()
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: rec, suspendFailed: map[types.UID]time.Time{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1"}}
	ctx := context.Background()

	for _, tc := range []struct {
		err    error
		reason string
		says   string
	}{
		// Wrapped, as suspend passes it on.
		{fmt.Errorf("snapshot: %w", &agentclient.APIError{Code: http.StatusRequestEntityTooLarge, Message: "the snapshot is 80 MB, more than the limit"}),
			sandboxv1alpha1.ReasonTooLargeToMove, "over the snapshot limit"},
		{nil, sandboxv1alpha1.ReasonNoSnapshotStore, "no snapshot store"},
		{errors.New("store: connection refused"), sandboxv1alpha1.ReasonSuspendFailed, "could not be saved"},
	} {
		if err := r.unmovable(ctx, ses, pod, "node n1 is cordoned", tc.err); err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionMovable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.says) ||
			!strings.Contains(c.Message, "node n1 is cordoned") {
			t.Fatalf("want Movable=False %s saying %q, got %+v", tc.reason, tc.says, c)
		}
		select {
		case e := <-rec.Events:
			if !strings.Contains(e, tc.reason) {
				t.Errorf("want a %s Event, got %q", tc.reason, e)
			}
		default:
			t.Errorf("no Event for %s", tc.reason)
		}
		// The same again: no second write, no second Event.
		if err := r.unmovable(ctx, ses, pod, "node n1 is cordoned", tc.err); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-rec.Events:
			t.Errorf("a second Event for the same reason: %q", e)
		default:
		}
	}
	// Within a minute of a failed move, the Session is not moved again (it is
	// looked after as any Ready Session meanwhile).
	now := time.Now()
	r.Deps.Snapshots = nil
	if r.mayMove(ses, now) {
		t.Error("no store: no move")
	}
}
