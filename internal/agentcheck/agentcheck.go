// Package agentcheck learns which agent build and wire-contract version each
// sandbox pod runs, once per pod, before the manager leases it. A pool's
// image carries its own agent, so pods of an older (or newer) release stay
// alive across a manager upgrade: the manager calls only the agents whose
// protocol it speaks (protocol.Supports) and its pool controller replaces
// the others. The question is the agent's /v1/healthz (no token, one round
// trip on the pod network), asked when the pod is first seen Ready, so a
// warm claim waits for nothing.
package agentcheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// UnknownBuild names the build of an agent that does not say; maxBuild is
// the longest build name kept (status.agents' limit).
const (
	UnknownBuild = "unknown"
	maxBuild     = 128
)

// askTimeout bounds one question; retryAfter spaces the questions to a pod
// that did not answer (its readiness may be ahead of its network).
const (
	askTimeout = 3 * time.Second
	retryAfter = time.Second
	maxAsks    = 10
	// inFlight bounds the questions asked at once: a pool of thousands that
	// becomes Ready together is asked a few at a time.
	inFlight = 32
)

// Info is what a pod's agent said of itself.
type Info struct {
	Build     string
	Protocol  int
	Supported bool
}

// Asker asks a pod's agent for its health.
type Asker func(ctx context.Context, pod *corev1.Pod) (*protocol.Health, error)

// Checker remembers, by pod UID, what each agent said. Safe for concurrent use.
type Checker struct {
	ask Asker
	// learned hears of each pod whose agent answered, without the lock: the
	// dispatcher looks at the pod again.
	learned func(pod *corev1.Pod)

	mu     sync.Mutex
	known  map[types.UID]Info
	asking map[types.UID]int // questions asked so far, of the pods queued or being asked
	// todo is the queue of pods to ask, worked by at most inFlight workers:
	// a manager that starts beside 10,000 Ready pods keeps a queue, not
	// 10,000 goroutines.
	todo    []*corev1.Pod
	workers int
}

// New returns a Checker that asks with ask and tells learned of each answer.
func New(ask Asker, learned func(pod *corev1.Pod)) *Checker {
	return &Checker{ask: ask, learned: learned, known: map[types.UID]Info{}, asking: map[types.UID]int{}}
}

// Lookup returns what the pod's agent said, if it did.
func (c *Checker) Lookup(uid types.UID) (Info, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.known[uid]
	return i, ok
}

// Usable reports whether the pod may be chosen for a claim: false once its
// agent said it speaks a protocol the manager does not. A Ready pod not yet
// asked is asked in the background (learned hears the answer) and counts as
// usable meanwhile: the claim asks it first (Check) if the answer is not in
// by then, so that a manager that just started has its pods at once.
// Never blocks.
func (c *Checker) Usable(pod *corev1.Pod) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.known[pod.UID]; ok {
		return i.Supported
	}
	if _, queued := c.asking[pod.UID]; !queued && sandboxpod.IsReady(pod) && pod.Status.PodIP != "" {
		c.asking[pod.UID] = 0
		c.enqueue(slim(pod))
	}
	return true
}

// slim is what asking a pod's agent and telling of its answer need of it.
func slim(p *corev1.Pod) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, Labels: p.Labels},
		Status:     corev1.PodStatus{PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
}

// enqueue queues a pod to ask, starting a worker if fewer than inFlight run. c.mu held.
func (c *Checker) enqueue(pod *corev1.Pod) {
	c.todo = append(c.todo, pod)
	if c.workers < inFlight {
		c.workers++
		go c.work()
	}
}

// work asks the queued pods until the queue is empty.
func (c *Checker) work() {
	for {
		c.mu.Lock()
		if len(c.todo) == 0 {
			c.workers--
			c.mu.Unlock()
			return
		}
		pod := c.todo[0]
		c.todo[0] = nil
		c.todo = c.todo[1:]
		_, queued := c.asking[pod.UID]
		c.mu.Unlock()
		if queued { // else deleted meanwhile, or answered through Check
			c.learn(pod)
		}
	}
}

// learn asks one pod; a pod that does not answer (its readiness may be ahead
// of its network) is queued again after retryAfter, up to maxAsks questions.
func (c *Checker) learn(pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	h, err := c.ask(ctx, pod)
	cancel()
	c.mu.Lock()
	asked, queued := c.asking[pod.UID]
	c.mu.Unlock()
	if !queued {
		return // deleted meanwhile, or answered through Check
	}
	if err == nil {
		c.store(pod, h)
		return
	}
	time.AfterFunc(retryAfter, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if n, ok := c.asking[pod.UID]; !ok || n != asked {
			return
		}
		if asked+1 >= maxAsks {
			// Asked again at its next change: a Ready pod that never answers
			// is unusable anyway, and its pool sees it fail.
			delete(c.asking, pod.UID)
			return
		}
		c.asking[pod.UID] = asked + 1
		c.enqueue(pod)
	})
}

// Check returns nil when the manager may call the pod's agent, asking it
// first if its answer is not in yet: every claim of a pod goes through it,
// so no agent is sent work before it said it speaks the protocol.
func (c *Checker) Check(ctx context.Context, pod *corev1.Pod) error {
	if c == nil {
		return nil // a reconciler built without one (narrow unit tests)
	}
	info, ok := c.Lookup(pod.UID)
	if !ok {
		actx, cancel := context.WithTimeout(ctx, askTimeout)
		h, err := c.ask(actx, pod)
		cancel()
		if err != nil {
			return fmt.Errorf("ask the agent of pod %s which protocol it speaks: %w", pod.Name, err)
		}
		info = c.store(pod, h)
	}
	if !info.Supported {
		return &UnsupportedError{Pod: pod.Name, Info: info}
	}
	return nil
}

// UnsupportedError: the pod's agent speaks a protocol this manager does not.
type UnsupportedError struct {
	Pod  string
	Info Info
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("the agent of pod %s (build %s) speaks protocol %d; this manager speaks %d to %d",
		e.Pod, e.Info.Build, e.Info.Protocol, protocol.OldestVersion, protocol.Version)
}

// store keeps what the pod's agent said and tells learned (aside: it takes
// the dispatcher's lock, which a caller of Check may hold).
func (c *Checker) store(pod *corev1.Pod, h *protocol.Health) Info {
	info := infoOf(h)
	c.mu.Lock()
	_, had := c.known[pod.UID]
	c.known[pod.UID] = info
	delete(c.asking, pod.UID)
	c.mu.Unlock()
	if !had && c.learned != nil {
		go c.learned(pod)
	}
	return info
}

// Forget drops a deleted pod.
func (c *Checker) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.known, uid)
	delete(c.asking, uid)
}

func infoOf(h *protocol.Health) Info {
	v := h.Protocol
	if v == 0 {
		v = 1 // an agent that predates versions speaks 1
	}
	build := h.Agent
	if build == "" {
		build = UnknownBuild
	}
	if len(build) > maxBuild {
		// The image, and so the agent, is the pool owner's: a build name
		// longer than status.agents admits would fail every status write.
		build = build[:maxBuild]
	}
	return Info{Build: build, Protocol: v, Supported: protocol.Supports(v)}
}
