//go:build e2e

package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The short variant of test/chaos on the real cluster: gVisor pods, the
// manager as a Deployment of two replicas under leader election, and the
// faults a cluster really has: the leading manager's pod killed (no graceful
// lease release), busy sandbox pods deleted, the API server restarted (on the
// local cluster). Code cannot write to the host from gVisor, so double runs
// are caught by the session counter: each step of a session adds one to a
// variable and returns it, and a step that ran twice returns one too many.
// E2E_CHAOS_EXECUTIONS (default 60) sizes it and E2E_CHAOS_SEED (default 1)
// seeds it; it takes five to six minutes on two cores.

type chaosKind string

const (
	chaosPlain   chaosKind = "plain"
	chaosRaise   chaosKind = "raise"
	chaosTimeout chaosKind = "timeout"
	chaosCancel  chaosKind = "cancel"
	chaosFresh   chaosKind = "fresh"
	chaosSession chaosKind = "session"
)

type chaosCase struct {
	kind    chaosKind
	i       int
	session string
}

var _ = Describe("exactly once under faults on a real cluster", Ordered, func() {

	BeforeAll(func() {
		scaleManager("2") // a leader to kill, and one to take over
		DeferCleanup(func() { scaleManager(managerReplicas) })
	})

	It("ends every Execution once, with the right result, and leaks no pod while leaders, pods and the API server fail", func() {
		n, err := strconv.Atoi(envOr("E2E_CHAOS_EXECUTIONS", "60"))
		Expect(err).NotTo(HaveOccurred(), "E2E_CHAOS_EXECUTIONS")
		seed, _ := strconv.ParseInt(envOr("E2E_CHAOS_SEED", "1"), 10, 64)
		rng := rand.New(rand.NewSource(seed))
		ns := newNamespace()
		plain := warmPool(wrappers.Pool(ns, "plain").Replicas(3).GracePeriod(time.Second))
		fresh := warmPool(wrappers.Pool(ns, "fresh").Replicas(2).Reuse(sandboxv1alpha1.ReuseFreshInterpreter))

		cases := map[string]chaosCase{}
		var mu sync.Mutex
		stop := make(chan struct{})
		faults := map[string]int{}
		faultsDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(faultsDone)
			chaosFaults(rng.Int63(), ns, stop, func(f string) { mu.Lock(); faults[f]++; mu.Unlock() })
		}()

		start := time.Now()
		for i := 0; i < n; i++ {
			c, w := mixedExecution(rng, ns, i, plain, fresh)
			ex := w.Obj()
			createThroughFaults(ex)
			cases[ex.Name] = c
			if c.kind == chaosCancel {
				after := time.Duration(500+rng.Intn(1500)) * time.Millisecond
				go func(ex *sandboxv1alpha1.Execution) {
					defer GinkgoRecover()
					time.Sleep(after)
					patchThroughFaults(ex, `{"spec":{"cancel":true}}`)
				}(ex)
			}
			time.Sleep(time.Duration(200+rng.Intn(400)) * time.Millisecond)
		}
		close(stop)
		<-faultsDone

		By("waiting for every Execution to end")
		// On two cores each Execution of the plain pool costs a gVisor pod start
		// and stop; with the faults' replacements the node runs at a load of 40
		// and more; in a local run this wait took 4.5 min of the 5 it had, so it
		// has room now for a slower CI machine.
		var all []sandboxv1alpha1.Execution
		Eventually(func(g Gomega) {
			list := &sandboxv1alpha1.ExecutionList{}
			g.Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			all = list.Items
			for _, ex := range all {
				g.Expect(ex.Status.Phase.IsFinished()).To(BeTrue(), "%s is %s: %+v", ex.Name, ex.Status.Phase, ex.Status.Conditions)
			}
		}).WithTimeout(10 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		took := time.Since(start)

		r := checkChaos(all, cases)
		By("checking that no pod is leaked or left claimed, and the pools refill")
		for _, pool := range []*sandboxv1alpha1.SandboxPool{plain, fresh} {
			Eventually(func(g Gomega) {
				for _, p := range poolPods(g, pool) {
					if uid := lease.ClaimedBy(&p); uid != "" && p.DeletionTimestamp == nil {
						g.Expect(uid).To(BeEmpty(), "pod %s is still claimed by %s", p.Name, p.Annotations[sandboxpod.AnnotationClaimedBy])
					}
				}
			}).WithTimeout(2 * time.Minute).Should(Succeed())
			waitWarm(pool)
		}
		mu.Lock()
		report := fmt.Sprintf("%d Executions in %s (seed %d); faults %v; outcomes %v; lost 0, double runs %d, wrong results %d, leaked pods 0",
			len(all), took.Round(time.Second), seed, faults, r.outcomes, r.double, r.wrong)
		mu.Unlock()
		AddReportEntry("chaos", report)
		fmt.Fprintln(GinkgoWriter, report)
		Expect(r.problems).To(BeEmpty(), report)
		Expect(len(all)).To(Equal(n))
		Expect(faults).To(HaveKey("kill-leader"))
		Expect(faults).To(HaveKey("delete-pod"))
	})
})

// mixedExecution is the i-th Execution of a mixed load: plain runs (some busy
// for a while), errors, timeouts, cancels, runs on a FreshInterpreter pool,
// and steps of six sessions that count, so that a step run twice shows.
func mixedExecution(rng *rand.Rand, ns string, i int, plain, fresh *sandboxv1alpha1.SandboxPool) (chaosCase, *wrappers.ExecutionWrapper) {
	c := chaosCase{i: i}
	w := wrappers.Execution(ns, fmt.Sprintf("c-%03d", i)).Pool(plain.Name)
	switch x := rng.Intn(100); {
	case x < 20:
		c.kind = chaosPlain
		w.Code(fmt.Sprintf("print('c-%03d')\n%d * %d", i, i, i))
	case x < 30: // busy for a while: something for the faults to hit
		c.kind = chaosPlain
		w.Code(fmt.Sprintf("import time\ntime.sleep(2)\n%d * %d", i, i))
	case x < 38:
		c.kind = chaosRaise
		w.Code(fmt.Sprintf("raise ValueError('c-%03d')", i))
	case x < 43:
		c.kind = chaosTimeout
		w.Code("while True:\n    pass").Timeout(2 * time.Second)
	case x < 48:
		c.kind = chaosCancel
		w.Code("import time\ntime.sleep(30)").Timeout(40 * time.Second)
	case x < 65:
		c.kind = chaosFresh
		w.Pool(fresh.Name).Code("seen = 'leak' in globals()\nleak = 1\nseen")
	default:
		c.kind, c.session = chaosSession, fmt.Sprintf("s%d", rng.Intn(6))
		w.Session(c.session).Code("n = globals().get('n', 0) + 1\nn")
	}
	return c, w
}

// exactOutcome is the end each kind of mixedExecution has when nothing fails
// under it: the phase and the Complete condition's reason.
var exactOutcome = map[chaosKind]string{
	chaosPlain: "Succeeded/Succeeded", chaosFresh: "Succeeded/Succeeded", chaosSession: "Succeeded/Succeeded",
	chaosRaise: "Failed/Error", chaosTimeout: "TimedOut/TimedOut", chaosCancel: "Cancelled/Cancelled",
}

type chaosReport struct {
	outcomes      map[string]int
	double, wrong int
	problems      []string
}

// checkChaos checks each Execution's end against what its code computes.
func checkChaos(all []sandboxv1alpha1.Execution, cases map[string]chaosCase) chaosReport {
	r := chaosReport{outcomes: map[string]int{}}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	succeededInSession := map[string]int{}
	for _, ex := range all {
		c, ok := cases[ex.Name]
		if !ok {
			continue
		}
		reason := ""
		if cond := meta.FindStatusCondition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete); cond != nil {
			reason = cond.Reason
		}
		if reason == "" {
			r.problems = append(r.problems, fmt.Sprintf("%s ended %s without a reason", ex.Name, ex.Status.Phase))
		}
		r.outcomes[string(ex.Status.Phase)+"/"+reason]++
		if ex.Status.Phase != sandboxv1alpha1.PhaseSucceeded {
			if c.kind == chaosPlain || c.kind == chaosFresh || c.kind == chaosSession {
				// Allowed only for a fault's reason, never for the code's own error.
				if reason == "Error" {
					r.problems = append(r.problems, fmt.Sprintf("%s (%s) failed with the code's error: %+v", ex.Name, c.kind, ex.Status.Error))
				}
			}
			continue
		}
		want := ""
		switch c.kind {
		case chaosPlain:
			want = strconv.Itoa(c.i * c.i)
		case chaosFresh:
			want = "False"
		case chaosSession:
			succeededInSession[c.session]++
			want = strconv.Itoa(succeededInSession[c.session])
		default:
			r.problems = append(r.problems, fmt.Sprintf("%s (%s) Succeeded", ex.Name, c.kind))
			continue
		}
		if ex.Status.Result != want {
			r.wrong++
			if c.kind == chaosSession {
				r.double++
			}
			r.problems = append(r.problems, fmt.Sprintf("%s (%s) returned %q, want %q (pod %s)", ex.Name, c.kind, ex.Status.Result, want, ex.Status.PodName))
		}
	}
	return r
}

// chaosFaults injects a fault every 4 to 8 s until stop: each kind once in a
// seeded order, then at random.
func chaosFaults(seed int64, ns string, stop <-chan struct{}, record func(string)) {
	rng := rand.New(rand.NewSource(seed))
	faultFailed := false
	kinds := []string{"kill-leader", "delete-pod"}
	if len(apiServerRestart()) > 0 {
		kinds = append(kinds, "restart-apiserver")
	}
	order := rng.Perm(len(kinds))
	giveUp := time.Now().Add(3 * time.Minute)
	for i := 0; ; i++ {
		// Each kind once first (retried each second until it finds a target,
		// even after the submissions ended, for up to giveUp), then at random until stop.
		first := i < len(order) && time.Now().Before(giveUp)
		wait := time.Duration(4000+rng.Intn(4000)) * time.Millisecond
		if first && faultFailed {
			wait = time.Second
		}
		select {
		case <-stop:
			if !first {
				return
			}
			time.Sleep(wait)
		case <-time.After(wait):
		}
		k := kinds[rng.Intn(len(kinds))]
		if first {
			k = kinds[order[i]]
		}
		var done bool
		switch k {
		case "kill-leader":
			done = killLeader()
		case "delete-pod":
			done = deleteBusySandbox(ns, rng)
		case "restart-apiserver":
			argv := apiServerRestart()
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "%s", out)
			done = true
		}
		faultFailed = !done
		if done {
			record(k)
			fmt.Fprintf(GinkgoWriter, "%s fault: %s\n", time.Now().Format("15:04:05.000"), k)
		} else if first {
			i-- // the same kind again
		}
	}
}

// apiServerRestart is the command that restarts the cluster's API server and
// returns once it serves again: the cluster's own script knows how
// (E2E_APISERVER_RESTART, which make test-e2e and make test-e2e-kind set for
// the clusters they bring up). Empty on a cluster of the user's: the fault is
// left out rather than guessed at.
func apiServerRestart() []string { return strings.Fields(os.Getenv("E2E_APISERVER_RESTART")) }

// killLeader deletes the pod holding the controllers' lease with no grace:
// the kubelet stops its process at once (SIGTERM, SIGKILL two seconds later),
// in the middle of whatever it was writing.
func killLeader() bool {
	pod := leaderPod()
	if pod == "" {
		return false
	}
	p := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: pod}, p); err != nil {
		return false
	}
	return k8s.Delete(ctx, p, client.GracePeriodSeconds(0)) == nil
}

// deleteBusySandbox deletes a sandbox pod that runs code.
func deleteBusySandbox(ns string, rng *rand.Rand) bool {
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelState: sandboxpod.StateBusy}); err != nil {
		return false
	}
	var busy []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			busy = append(busy, p)
		}
	}
	if len(busy) == 0 {
		return false
	}
	return k8s.Delete(ctx, &busy[rng.Intn(len(busy))], client.GracePeriodSeconds(0)) == nil
}

// createThroughFaults creates ex, retrying while the API server is away; a
// create that landed before an error shows as AlreadyExists.
func createThroughFaults(ex *sandboxv1alpha1.Execution) {
	GinkgoHelper()
	Eventually(func() error {
		err := k8s.Create(ctx, ex.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(Succeed())
}

func patchThroughFaults(ex *sandboxv1alpha1.Execution, patch string) {
	GinkgoHelper()
	Eventually(func() error {
		return k8s.Patch(ctx, ex.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(patch)))
	}).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(Succeed())
}
