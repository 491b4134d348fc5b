// Package agentgate is the manager's one door to a sandbox pod's agent.
// Every call the manager makes to an agent (a claim's run, a run found again
// after a restart, a Session's lease and its checks, the data plane, a reset
// for reuse, a snapshot, the version question) gets its client here, and only
// for a pod that passes the same checks, given the pool and the object the
// call serves:
//
//   - the pool controls the pod as its owner;
//   - the pod is built as the pool builds its pods, and its agent trusts a
//     key the manager signs with (lease.MayServe; a pod a Session or an
//     Execution holds under the UID it recorded was judged when it was
//     given, so that a change of the pool does not strand its holder mid-run:
//     its owner and key are judged still, lease.MayKeep);
//   - its agent speaks a protocol the manager speaks (agentcheck);
//   - the pod's claim names the object's UID (an Execution's claim, a
//     Session's lease, a reset's mark);
//   - the pod's UID is the one the object's status recorded.
//
// Anyone who may create pods in a namespace can give one a pool's labels, the
// claim of a waiting Execution, or the name of a pod that is gone: such a pod
// gets no code, no token and no answer stored from it.
//
// A unit test (boundary_test.go) fails if anything else in the manager
// builds an agent client, or if a controller imports the agent's packages.
package agentgate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agentcheck"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Agent is a client of one pod's agent, every request of which carries a
// token for that pod alone. Only a Gate makes one.
type Agent = agentclient.Client

// What the users of an Agent need of the wire client, under the gate's name:
// nothing outside this package imports the agent's packages.
type (
	SnapshotOptions = agentclient.SnapshotOptions
	RestoreOptions  = agentclient.RestoreOptions
	APIError        = agentclient.APIError
)

// IsStatus reports whether err is the agent's answer with that HTTP status.
func IsStatus(err error, code int) bool { return agentclient.IsStatus(err, code) }

// IsAPIError reports whether err is an answer of the agent (any status),
// not a failure to reach it.
func IsAPIError(err error) bool { return agentclient.IsAPIError(err) }

// Keys sign the tokens of the calls and say which keys a pod may trust.
type Keys interface {
	lease.Keys
	Token(podUID, keyID string) (string, error)
}

// Resolver finds a pod's agent.
type Resolver interface {
	Address(pod *corev1.Pod) (string, error)
}

// PodIPResolver reaches agents at http://<pod IP>:<port>.
type PodIPResolver struct{ Port int }

// Address implements Resolver.
func (r PodIPResolver) Address(pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	port := r.Port
	if port == 0 {
		port = sandboxpod.AgentPort
	}
	return fmt.Sprintf("http://%s:%d", pod.Status.PodIP, port), nil
}

// Holder is what a call to an agent serves: the claim on the pod must name
// it, and the pod must be the one its status recorded.
type Holder struct {
	what string
	// claim reads the UID the pod's claim names for this kind of holder.
	claim func(*corev1.Pod) types.UID
	uid   types.UID
	// podUID is the pod UID the holder recorded; "" when it has none yet
	// (a claim being made: Admit, never Open).
	podUID types.UID
	// keeps: the pod the holder recorded was judged against the pool's
	// build when it was given, and is not judged again (lease.MayKeep).
	keeps bool
	probe bool
}

// ForExecution: a run of ex (its claim, its status.podUID).
func ForExecution(ex *sandboxv1alpha1.Execution) Holder {
	return Holder{what: "Execution " + ex.Name, claim: lease.ClaimedBy, uid: ex.UID, podUID: ex.Status.PodUID, keeps: true}
}

// ForSession: a call for ses (its lease, its status.podUID).
func ForSession(ses *sandboxv1alpha1.Session) Holder {
	return Holder{what: "Session " + ses.Name, claim: func(p *corev1.Pod) types.UID { return lease.HolderUID(p, ses) },
		uid: ses.UID, podUID: ses.Status.PodUID, keeps: true}
}

// ForSessionLease: the calls that make a Session's lease, between the claim
// of pod (written with its UID as precondition, which pins it) and the
// status that records it.
func ForSessionLease(ses *sandboxv1alpha1.Session, pod *corev1.Pod) Holder {
	h := ForSession(ses)
	h.podUID = pod.UID
	return h
}

// ForRun: a one-call run of ses on the pod the data plane claimed for it
// (lease.ClaimForRun) while it created ses, before the manager wrote ses's
// UID on the pod: the claim names ses's run and caller (lease.HeldBy).
func ForRun(ses *sandboxv1alpha1.Session, pod *corev1.Pod) Holder {
	return Holder{what: "Session " + ses.Name, uid: ses.UID, podUID: pod.UID,
		claim: func(p *corev1.Pod) types.UID { return lease.HolderUID(p, ses) }}
}

// ForReset: a reset for reuse of the pod with UID podUID, which its last
// holder released for it (lease.ReleaseForReset).
func ForReset(podUID types.UID) Holder {
	return Holder{what: "a reset for reuse", claim: resetMark, uid: resetUID, podUID: podUID}
}

// resetUID stands for the reset's mark on the pod.
const resetUID types.UID = "reset"

func resetMark(pod *corev1.Pod) types.UID {
	if _, ok := lease.ResetSince(pod); ok {
		return resetUID
	}
	return ""
}

// Refused is the gate's answer for a pod that may not serve the holder.
type Refused struct {
	Pod    string
	Holder string
	Why    string
}

func (e *Refused) Error() string {
	return fmt.Sprintf("pod %s may not serve %s: %s", e.Pod, e.Holder, e.Why)
}

// IsRefused reports whether err is the gate's refusal.
func IsRefused(err error) bool {
	var r *Refused
	return errors.As(err, &r)
}

// Gate opens agent clients. Safe for concurrent use.
type Gate struct {
	keys     Keys
	resolver Resolver
	// pools reads the pool of a pod the version question is asked of.
	pools  client.Reader
	agents *agentcheck.Checker
	// http is shared by the clients of all agents; idle connections to
	// pods that are gone expire instead of piling up.
	http *http.Client
}

// New returns a Gate. learned hears of each pod whose agent said which
// protocol it speaks (agentcheck); pools reads the pools of the pods asked.
func New(keys Keys, resolver Resolver, pools client.Reader, learned func(*corev1.Pod)) *Gate {
	if resolver == nil {
		resolver = PodIPResolver{}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2
	tr.IdleConnTimeout = 30 * time.Second
	g := &Gate{keys: keys, resolver: resolver, pools: pools, http: &http.Client{Transport: tr}}
	g.agents = agentcheck.New(g.askVersion, learned)
	return g
}

// Agents is what the gate learned of each pod's agent (the dispatcher's
// Usable, the pool's status).
func (g *Gate) Agents() *agentcheck.Checker { return g.agents }

// Admit checks everything but the recorded pod UID and the agent's protocol,
// without a call: for a claim about to be made or to be carried on, whose
// status does not record the pod yet.
func (g *Gate) Admit(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, h Holder) error {
	refuse := func(why string) error { return &Refused{Pod: pod.Name, Holder: h.what, Why: why} }
	if pool == nil {
		return refuse("its pool is gone")
	}
	judge := lease.MayServe
	if h.keeps && h.podUID != "" && h.podUID == pod.UID {
		judge = lease.MayKeep // judged when it was given; its UID pins that very pod
	}
	if err := judge(pool, pod, g.keys); err != nil {
		return refuse(err.Error())
	}
	if h.probe {
		return nil
	}
	if got := h.claim(pod); got != h.uid {
		if got == "" {
			return refuse("its claim does not name it")
		}
		return refuse(fmt.Sprintf("its claim names %s", got))
	}
	if sandboxpod.IsTerminal(pod) {
		return refuse("it has stopped or is being deleted")
	}
	return nil
}

// Open returns a client of the pod's agent for h, or why not (a *Refused,
// or the error of the question of its protocol).
func (g *Gate) Open(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod, h Holder) (*Agent, error) {
	if err := g.Admit(pool, pod, h); err != nil {
		return nil, err
	}
	if !h.probe {
		if h.podUID == "" {
			return nil, &Refused{Pod: pod.Name, Holder: h.what, Why: "its status records no pod UID"}
		}
		if h.podUID != pod.UID {
			return nil, &Refused{Pod: pod.Name, Holder: h.what,
				Why: fmt.Sprintf("it is not the pod it recorded (UID %s, not %s): the pod under this name is another one", pod.UID, h.podUID)}
		}
		if err := g.agents.Check(ctx, pod); err != nil {
			var unsupported *agentcheck.UnsupportedError
			if errors.As(err, &unsupported) {
				return nil, &Refused{Pod: pod.Name, Holder: h.what, Why: err.Error()}
			}
			return nil, err
		}
	}
	return g.client(pod)
}

// Health asks the agent of a pod no one holds yet how it is (its
// readiness, its interpreter), for its pool: a question that gives the pod
// nothing, asked of a pod the pool may lease. Not a client: nothing else is
// asked of a pod before it is claimed.
func (g *Gate) Health(ctx context.Context, pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (*protocol.Health, error) {
	c, err := g.probe(pool, pod)
	if err != nil {
		return nil, err
	}
	return c.Ready(ctx)
}

// probe opens a client for the pool's questions of a pod no one holds.
func (g *Gate) probe(pool *sandboxv1alpha1.SandboxPool, pod *corev1.Pod) (*Agent, error) {
	if err := g.Admit(pool, pod, Holder{what: "its pool", probe: true}); err != nil {
		return nil, err
	}
	return g.client(pod)
}

// client builds the client: the only place in the manager that does.
func (g *Gate) client(pod *corev1.Pod) (*Agent, error) {
	addr, err := g.resolver.Address(pod)
	if err != nil {
		return nil, fmt.Errorf("reach the agent of pod %s: %w", pod.Name, err)
	}
	uid, keyID := string(pod.UID), pod.Labels[sandboxpod.LabelAgentKey]
	return agentclient.NewWithHTTP(addr, "", g.http).WithTokenSource(func() (string, error) {
		return g.keys.Token(uid, keyID)
	}), nil
}

// askVersion is agentcheck's question, asked of a pod only when its pool
// owns it and may lease it. agentcheck queues slim copies of the pods it
// learns about: such a pod is read again, in full, to be judged.
func (g *Gate) askVersion(ctx context.Context, pod *corev1.Pod) (*protocol.Health, error) {
	if len(pod.Spec.Containers) == 0 {
		full := &corev1.Pod{}
		if err := g.pools.Get(ctx, client.ObjectKeyFromObject(pod), full); err != nil {
			return nil, fmt.Errorf("read pod %s: %w", pod.Name, err)
		}
		if full.UID != pod.UID {
			return nil, fmt.Errorf("pod %s was replaced by another of its name", pod.Name)
		}
		pod = full
	}
	pool := &sandboxv1alpha1.SandboxPool{}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[sandboxpod.LabelPool]}
	if err := g.pools.Get(ctx, key, pool); err != nil {
		return nil, fmt.Errorf("pool of pod %s: %w", pod.Name, err)
	}
	c, err := g.probe(pool, pod)
	if err != nil {
		return nil, err
	}
	return c.Health(ctx) // liveness: the agent says its version while its interpreter starts
}
