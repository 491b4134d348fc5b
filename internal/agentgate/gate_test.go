package agentgate_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentgate"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// keys: not loaded, so the pods' keys are not judged (nothing is signed).
type keys struct{}

func (keys) Loaded() bool                         { return false }
func (keys) Trusted(string) (string, bool)        { return "", false }
func (keys) Token(string, string) (string, error) { return "token", nil }

// agent answers the version question with protocol and counts every request.
func agent(t *testing.T, version int) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_ = json.NewEncoder(w).Encode(protocol.Health{Protocol: version, Interpreter: "i-1"})
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

type at string

func (a at) Address(*corev1.Pod) (string, error) { return string(a), nil }

// fixture: a pool, and a pod built and owned as the pool builds its pods,
// claimed by ex, which recorded it.
func fixture() (*sandboxv1alpha1.SandboxPool, *corev1.Pod, *sandboxv1alpha1.Execution) {
	pool := wrappers.Pool("ns", "python").Obj()
	pool.UID, pool.Generation = "pool-uid", 1
	pod := sandboxpod.New(pool, sandboxpod.AgentKey{ID: "k1"})
	pod.Name, pod.UID, pod.ResourceVersion = "python-abc", "pod-uid", "1"
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxPool",
		Name: pool.Name, UID: pool.UID, Controller: ptr(true)}}
	ex := wrappers.Execution("ns", "run").Obj()
	ex.UID = "ex-uid"
	pod.Annotations[sandboxpod.AnnotationClaimedUID] = string(ex.UID)
	ex.Status.PodName, ex.Status.PodUID = pod.Name, pod.UID
	return pool, pod, ex
}

func ptr[T any](v T) *T { return &v }

// newGate opens the agents at url; the version question reads the fixture's pool.
func newGate(url string) *agentgate.Gate {
	pool, _, _ := fixture()
	s := runtime.NewScheme()
	_ = sandboxv1alpha1.AddToScheme(s)
	return agentgate.New(keys{}, at(url), fake.NewClientBuilder().WithScheme(s).WithObjects(pool).Build(), nil)
}

func TestOpen(t *testing.T) {
	cases := []struct {
		name    string
		change  func(*sandboxv1alpha1.SandboxPool, *corev1.Pod, *sandboxv1alpha1.Execution)
		refused string // "" = opened
	}{
		{name: "the pool's pod, claimed by the Execution that recorded it"},
		{name: "not owned by the pool", refused: "not controlled by the pool",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				p.OwnerReferences = nil
			}},
		{name: "owned, but another image", refused: "image",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				p.Spec.Containers[0].Image = "example.com/tenant:1"
			}},
		{name: "claimed by another Execution", refused: "its claim names other-uid",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				p.Annotations[sandboxpod.AnnotationClaimedUID] = "other-uid"
			}},
		{name: "not claimed", refused: "its claim does not name it",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				delete(p.Annotations, sandboxpod.AnnotationClaimedUID)
			}},
		{name: "another pod under the recorded name", refused: "not the pod it recorded",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				p.UID = "lookalike-uid"
			}},
		{name: "no pod recorded", refused: "records no pod UID",
			change: func(_ *sandboxv1alpha1.SandboxPool, _ *corev1.Pod, ex *sandboxv1alpha1.Execution) {
				ex.Status.PodUID = ""
			}},
		{name: "being deleted", refused: "being deleted",
			change: func(_ *sandboxv1alpha1.SandboxPool, p *corev1.Pod, _ *sandboxv1alpha1.Execution) {
				p.DeletionTimestamp = &metav1.Time{}
			}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, calls := agent(t, protocol.Version)
			g := newGate(srv.URL)
			pool, pod, ex := fixture()
			if c.change != nil {
				c.change(pool, pod, ex)
				pod.ResourceVersion = strconv.Itoa(i + 2) // changed, as the API server would say
			}
			a, err := g.Open(context.Background(), pool, pod, agentgate.ForExecution(ex))
			if c.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if _, err := a.Ready(context.Background()); err != nil {
					t.Fatalf("the opened client does not reach the agent: %v", err)
				}
				return
			}
			if !agentgate.IsRefused(err) || !strings.Contains(err.Error(), c.refused) {
				t.Fatalf("got %v, want a refusal saying %q", err, c.refused)
			}
			if n := calls.Load(); n != 0 {
				t.Fatalf("the refused pod was asked %d requests", n)
			}
		})
	}
}

// A pod given to an Execution that recorded it keeps serving it after the
// pool's image changed (a rollout lets busy pods finish); the same pod,
// not yet given, is not leased.
func TestARecordedPodIsKeptAcrossAChangeOfThePool(t *testing.T) {
	srv, _ := agent(t, protocol.Version)
	g := newGate(srv.URL)
	pool, pod, ex := fixture()
	pool.Spec.Image, pool.Generation = "warmpool.dev/repl:next", 2
	if _, err := g.Open(context.Background(), pool, pod, agentgate.ForExecution(ex)); err != nil {
		t.Fatalf("the Execution's own pod: %v", err)
	}
	fresh := ex.DeepCopy()
	fresh.Status.PodUID = ""
	if err := g.Admit(pool, pod, agentgate.ForExecution(fresh)); !agentgate.IsRefused(err) || !strings.Contains(err.Error(), "image") {
		t.Fatalf("a claim on it now: got %v, want refused for its image", err)
	}
}

func TestOpenRefusesAnAgentOfAnotherProtocol(t *testing.T) {
	srv, _ := agent(t, protocol.Version+1)
	g := newGate(srv.URL)
	pool, pod, ex := fixture()
	if _, err := g.Open(context.Background(), pool, pod, agentgate.ForExecution(ex)); !agentgate.IsRefused(err) ||
		!strings.Contains(err.Error(), "protocol") {
		t.Fatalf("got %v, want a refusal of its protocol", err)
	}
}

func TestHolders(t *testing.T) {
	srv, _ := agent(t, protocol.Version)
	g := newGate(srv.URL)
	pool, pod, _ := fixture()
	delete(pod.Annotations, sandboxpod.AnnotationClaimedUID)
	ses := wrappers.Session("ns", "s").Obj()
	ses.UID = "ses-uid"
	ctx := context.Background()

	// A Session: its lease (the session UID annotation) and its recorded pod.
	pod.Labels[sandboxpod.LabelSession] = ses.Name
	pod.Annotations[sandboxpod.AnnotationSessionUID] = string(ses.UID)
	if _, err := g.Open(ctx, pool, pod, agentgate.ForSession(ses)); !agentgate.IsRefused(err) {
		t.Fatalf("a Session that recorded no pod: got %v, want refused", err)
	}
	if _, err := g.Open(ctx, pool, pod, agentgate.ForSessionLease(ses, pod)); err != nil {
		t.Fatalf("the lease being taken, on the pod claimed for it: %v", err)
	}
	ses.Status.PodUID = pod.UID
	if _, err := g.Open(ctx, pool, pod, agentgate.ForSession(ses)); err != nil {
		t.Fatalf("a Ready Session's pod: %v", err)
	}
	other := ses.DeepCopy()
	other.UID = "other-session"
	if _, err := g.Open(ctx, pool, pod, agentgate.ForSession(other)); !agentgate.IsRefused(err) {
		t.Fatalf("a Session of the same name, another UID: got %v, want refused", err)
	}

	// A reset: only the pod of that UID, marked for its reset.
	delete(pod.Labels, sandboxpod.LabelSession)
	if _, err := g.Open(ctx, pool, pod, agentgate.ForReset(pod.UID)); !agentgate.IsRefused(err) {
		t.Fatalf("a pod not released for a reset: got %v, want refused", err)
	}
	pod.Labels[sandboxpod.LabelState] = sandboxpod.StateResetting
	pod.Annotations[sandboxpod.AnnotationResetSince] = "2026-11-27T00:00:00Z"
	if _, err := g.Open(ctx, pool, pod, agentgate.ForReset(pod.UID)); err != nil {
		t.Fatalf("the released pod: %v", err)
	}
	if _, err := g.Open(ctx, pool, pod, agentgate.ForReset(types.UID("another"))); !agentgate.IsRefused(err) {
		t.Fatalf("another pod under its name: got %v, want refused", err)
	}

	// Without its pool, nothing.
	if _, err := g.Open(ctx, nil, pod, agentgate.ForReset(pod.UID)); !agentgate.IsRefused(err) {
		t.Fatalf("no pool: got %v, want refused", err)
	}
}
