package session

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// The Session's reconcile runs on every change it must act on, and not on
// the writes it made to a Ready Session's status (which would ask the agent
// for its health again at once).
func TestNeedsALook(t *testing.T) {
	ready := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Name: "s", Generation: 1}}
	ready.Status.Phase, ready.Status.PodName = sandboxv1alpha1.SessionReady, "p1"
	pending := ready.DeepCopy()
	pending.Status.Phase, pending.Status.PodName = sandboxv1alpha1.SessionPending, ""
	now := metav1.Now()
	cases := []struct {
		name string
		mut  func(old, cur *sandboxv1alpha1.Session)
		want bool
	}{
		{"its lease's Ready", func(old, cur *sandboxv1alpha1.Session) { *old = *pending.DeepCopy() }, false},
		{"its activity", func(old, cur *sandboxv1alpha1.Session) { cur.Status.Runs = 3; cur.Status.LastActivityTime = &now }, false},
		{"a new interpreter (the data plane's reset)", func(old, cur *sandboxv1alpha1.Session) { cur.Status.Interpreter = "b" }, false},
		{"spec.close", func(old, cur *sandboxv1alpha1.Session) { cur.Generation = 2; cur.Spec.Close = true }, true},
		{"an annotation (resume)", func(old, cur *sandboxv1alpha1.Session) {
			cur.Annotations = map[string]string{sandboxv1alpha1.AnnotationResume: "k"}
		}, true},
		{"deletion", func(old, cur *sandboxv1alpha1.Session) { cur.DeletionTimestamp = &now }, true},
		{"a finalizer", func(old, cur *sandboxv1alpha1.Session) { cur.Finalizers = []string{"x"} }, true},
		{"ended", func(old, cur *sandboxv1alpha1.Session) { cur.Status.Phase = sandboxv1alpha1.SessionClosed }, true},
		{"suspended", func(old, cur *sandboxv1alpha1.Session) { cur.Status.Phase = sandboxv1alpha1.SessionSuspended }, true},
		{"another pod", func(old, cur *sandboxv1alpha1.Session) { cur.Status.PodName = "p2" }, true},
		{"a pending status", func(old, cur *sandboxv1alpha1.Session) { *old, *cur = *pending.DeepCopy(), *pending.DeepCopy() }, true},
	}
	p := needsALook()
	for _, c := range cases {
		old, cur := ready.DeepCopy(), ready.DeepCopy()
		c.mut(old, cur)
		if got := p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}); got != c.want {
			t.Errorf("%s: a look = %v, want %v", c.name, got, c.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: ready}) || !p.Delete(event.DeleteEvent{Object: ready}) {
		t.Error("a created or deleted Session must be looked at")
	}
}
