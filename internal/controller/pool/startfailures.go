package pool

import (
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// The start-failure policy: a pod that fails before it ever ran code (a
// preload that does not import, an image without python) would fail again
// in its replacement. The pool keeps reporting Degraded with the pod's own
// words, and starts replacements with an exponential backoff (1 s doubling to
// 5 min, as the kubelet backs off a crash loop) until a pod of the current
// template becomes Ready or the template changes.

const (
	startBackoffBase = time.Second
	startBackoffMax  = 5 * time.Minute
)

type startFailure struct {
	hash    string
	count   int
	last    time.Time
	message string
	seen    map[types.UID]bool
}

// startFailures tracks the start failures of each pool's current template.
type startFailures struct {
	mu    sync.Mutex
	pools map[types.NamespacedName]*startFailure
}

// observe takes in the pool's pods: failed ones that never ran code count as
// start failures, a Ready one of the current template clears them. A Ready
// one of no use (useless says why: its agent speaks a protocol the manager
// does not) counts as a failure too: its replacement would be the same.
func (s *startFailures) observe(pool types.NamespacedName, hash string, pods []corev1.Pod, now time.Time, useless func(*corev1.Pod) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools == nil {
		s.pools = map[types.NamespacedName]*startFailure{}
	}
	f := s.pools[pool]
	if f != nil && f.hash != hash {
		f = nil // a new template deserves a fresh start
		delete(s.pools, pool)
	}
	for i := range pods {
		p := &pods[i]
		if p.Labels[sandboxpod.LabelTemplateHash] != hash {
			continue
		}
		if why := useless(p); why != "" {
			f = s.add(f, pool, hash, p.UID, fmt.Sprintf("pod %s: %s", p.Name, why), now)
			continue
		}
		if sandboxpod.IsReady(p) {
			delete(s.pools, pool)
			f = nil
			continue
		}
		if p.Status.Phase != corev1.PodFailed || lease.ClaimedBy(p) != "" || p.Annotations[sandboxpod.AnnotationUsed] != "" {
			continue
		}
		f = s.add(f, pool, hash, p.UID, fmt.Sprintf("pod %s: %s", p.Name, failureMessage(p)), now)
	}
}

func (s *startFailures) add(f *startFailure, pool types.NamespacedName, hash string, uid types.UID, message string, now time.Time) *startFailure {
	if f == nil {
		f = &startFailure{hash: hash, seen: map[types.UID]bool{}}
		s.pools[pool] = f
	}
	if !f.seen[uid] {
		f.seen[uid] = true
		f.count++
		f.last = now
		f.message = message
	}
	return f
}

// wait returns how long the pool should wait before it starts another pod,
// and what to report meanwhile; 0 and "" when nothing failed.
func (s *startFailures) wait(pool types.NamespacedName, now time.Time) (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.pools[pool]
	if f == nil || f.count == 0 {
		return 0, ""
	}
	backoff := startBackoffMax
	if f.count <= 20 {
		backoff = min(startBackoffBase<<(f.count-1), startBackoffMax)
	}
	left := f.last.Add(backoff).Sub(now)
	msg := fmt.Sprintf("%d pod(s) failed before they could run code; the last one said: %s", f.count, f.message)
	if left > 0 {
		msg += fmt.Sprintf(" (next pod in %s)", left.Round(time.Second))
	}
	return max(left, 0), msg
}

func (s *startFailures) forget(pool types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, pool)
}

// failureMessage is what the failed pod says about itself: its container's
// termination message (the agent writes why it gave up), else the pod's.
func failureMessage(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Message != "" {
			return t.Message
		}
	}
	if p.Status.Message != "" {
		return p.Status.Message
	}
	return "failed (" + p.Status.Reason + ")"
}
