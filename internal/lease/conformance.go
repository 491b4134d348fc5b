package lease

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// conformance remembers sandboxpod.Conforms' answers. The pool reconciler
// asks it of every pod of a pool on each reconcile and the dispatcher of each
// pod on each of its events; building the pod New would make for each answer
// was 12 % of the manager's CPU at 75 claims a second (test/scale, pprof). An
// answer holds for one version of the pod (its resourceVersion changes with
// any change to it, an image patched in by someone with pod rights included),
// of the pool's spec (its generation) and of the key the pod must trust.
// Objects without those (built in a test, not read from the API server) are
// judged every time.
type conformance struct {
	mu      sync.Mutex
	answers map[types.UID]conformAnswer
}

type conformAnswer struct {
	podRV   string
	pool    types.UID
	gen     int64
	trusted string
	err     error
}

// maxConformAnswers bounds the memory: answers of deleted pods are not
// forgotten one by one, so all go when there are this many.
const maxConformAnswers = 50000

var conforms = &conformance{answers: map[types.UID]conformAnswer{}}

func (c *conformance) check(pod *corev1.Pod, pool *sandboxv1alpha1.SandboxPool, trusted string) error {
	if pod.UID == "" || pod.ResourceVersion == "" || pool.UID == "" || pool.Generation == 0 {
		return sandboxpod.Conforms(pod, pool, trusted)
	}
	key := conformAnswer{podRV: pod.ResourceVersion, pool: pool.UID, gen: pool.Generation, trusted: trusted}
	c.mu.Lock()
	a, ok := c.answers[pod.UID]
	c.mu.Unlock()
	if ok && a.podRV == key.podRV && a.pool == key.pool && a.gen == key.gen && a.trusted == key.trusted {
		return a.err
	}
	key.err = sandboxpod.Conforms(pod, pool, trusted)
	c.mu.Lock()
	if len(c.answers) >= maxConformAnswers {
		clear(c.answers)
	}
	c.answers[pod.UID] = key
	c.mu.Unlock()
	return key.err
}
