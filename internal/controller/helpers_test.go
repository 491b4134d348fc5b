package controller_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

func getPool(ns, name string) *sandboxv1alpha1.SandboxPool {
	p := &sandboxv1alpha1.SandboxPool{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	return p
}

func getExec(ex *sandboxv1alpha1.Execution) *sandboxv1alpha1.Execution {
	got := &sandboxv1alpha1.Execution{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
	return got
}

// waitClaimed waits until ex's pod is claimed by it. Running and the claim are
// written together: specs that stop the manager mid-run wait for both, the
// state in which the code may have been sent (a stop before the claim is
// stored leaves a clean idle pod and the Execution queued, as the claim-race
// specs show).
func waitClaimed(ex *sandboxv1alpha1.Execution) string {
	GinkgoHelper()
	// Re-read each time: Running is written together with the claim, and an
	// Execution whose claim did not commit goes back to Pending and may claim
	// another pod.
	var name string
	Eventually(func() types.UID {
		got := getExec(ex)
		if name = got.Status.PodName; name == "" {
			return ""
		}
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, got.PodKey(), p); err != nil { // the pool's namespace (a shared pool's is another)
			return ""
		}
		return lease.ClaimedBy(p)
	}).Should(Equal(ex.UID), "the Execution runs on a pod it claimed")
	return name
}

// eventsOf lists the events of namespace ns about the object named regarding.
func eventsOf(ns, regarding string) []eventsv1.Event {
	GinkgoHelper()
	var evs eventsv1.EventList
	Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var out []eventsv1.Event
	for _, e := range evs.Items {
		if e.Regarding.Name == regarding {
			out = append(out, e)
		}
	}
	return out
}

// poolPods lists the live pods of a pool.
func poolPods(ns, pool string) []corev1.Pod {
	var list corev1.PodList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelPool: pool})).To(Succeed())
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// idleReady counts the pool's idle Ready pods.
func idleReady(ns, pool string) int {
	n := 0
	for _, p := range poolPods(ns, pool) {
		if sandboxpod.IsIdle(&p) {
			n++
		}
	}
	return n
}

// createPoolAndWait creates a pool and waits until it has replicas idle Ready pods.
func createPoolAndWait(pool *sandboxv1alpha1.SandboxPool) *sandboxv1alpha1.SandboxPool {
	Expect(k8s.Create(ctx, pool)).To(Succeed())
	want := int(pool.Spec.Replicas)
	Eventually(func() int { return idleReady(pool.Namespace, pool.Name) }).Should(Equal(want))
	Eventually(func() int32 { return getPool(pool.Namespace, pool.Name).Status.IdleReplicas }).Should(BeEquivalentTo(want))
	return getPool(pool.Namespace, pool.Name)
}

// finished waits for the Execution to end and returns it.
func finished(ex *sandboxv1alpha1.Execution) *sandboxv1alpha1.Execution {
	var got *sandboxv1alpha1.Execution
	Eventually(func() bool {
		got = getExec(ex)
		return got.Status.Phase.IsFinished()
	}).Should(BeTrue(), func() string { return fmt.Sprintf("execution %s status: %+v", ex.Name, got.Status) })
	return got
}

// runUntilDeleted creates ex and follows it by a watch until it is deleted: it
// must have Succeeded first, and be deleted within 10 s of it (its TTL being a
// second or so). A watch, not polling: with a 1 s TTL a loaded machine can
// delete the Execution between two reads of its final status.
func runUntilDeleted(ex *sandboxv1alpha1.Execution) {
	GinkgoHelper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx, &sandboxv1alpha1.ExecutionList{}, client.InNamespace(ex.Namespace))
	Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	Expect(k8s.Create(ctx, ex)).To(Succeed())
	var final sandboxv1alpha1.ExecutionPhase
	var finishedAt time.Time
	deadline := time.After(40 * time.Second)
	for deleted := false; !deleted; {
		select {
		case e, ok := <-w.ResultChan():
			Expect(ok).To(BeTrue(), "watch closed")
			got, isExec := e.Object.(*sandboxv1alpha1.Execution)
			if !isExec || got.Name != ex.Name {
				continue
			}
			if got.Status.Phase.IsFinished() && final == "" {
				final, finishedAt = got.Status.Phase, time.Now()
			}
			deleted = e.Type == watch.Deleted
		case <-deadline:
			Fail(fmt.Sprintf("not deleted in 40 s; final phase seen: %q", final))
		}
	}
	Expect(final).To(Equal(sandboxv1alpha1.PhaseSucceeded), "deleted before it finished")
	Expect(time.Since(finishedAt)).To(BeNumerically("<", 10*time.Second), "deleted long after its TTL")
}

// run creates an Execution and waits for it to end.
func run(ex *sandboxv1alpha1.Execution) *sandboxv1alpha1.Execution {
	Expect(k8s.Create(ctx, ex)).To(Succeed())
	return finished(ex)
}

// metaCondition is a condition reduced to what tests compare.
type metaCondition struct{ Status, Reason, Message string }

func condition(conds []metav1.Condition, t string) *metaCondition {
	c := meta.FindStatusCondition(conds, t)
	if c == nil {
		return nil
	}
	return &metaCondition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
}

// applySamples creates every object of the YAML files in dir, as kubectl apply -f would.
func applySamples(ns, dir string) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	for _, f := range files {
		data, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		for _, doc := range strings.Split(string(data), "\n---\n") {
			obj := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal([]byte(doc), &obj.Object)).To(Succeed())
			if len(obj.Object) == 0 {
				continue
			}
			obj.SetNamespace(ns)
			Expect(k8s.Create(ctx, obj)).To(Succeed(), f)
		}
	}
}
