package controller_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// lookalike copies a pod of the pool as a tenant with the right to create
// pods could: the pool's labels and the agent's arguments (so the test
// kubelet starts a real agent that would answer), under a name that sorts
// before the pool's own pods (the dispatcher takes the lowest name among
// equals), then changed by change.
func lookalike(of *corev1.Pod, name string, change func(*corev1.Pod)) *corev1.Pod {
	GinkgoHelper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: of.Namespace, Name: name,
		Labels: of.Labels, Annotations: of.Annotations}, Spec: *of.Spec.DeepCopy()}
	p.Spec.NodeName = ""
	change(p)
	Expect(k8s.Create(ctx, p)).To(Succeed())
	if len(p.OwnerReferences) > 0 {
		return p // the pool may replace it before it is Ready
	}
	Eventually(func() bool {
		got := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	}).Should(BeTrue(), "the look-alike's agent runs and it is Ready, as a tenant's would be")
	return p
}

// replacedWhileAway stops the manager, deletes orig and makes a look-alike
// under its name (its labels and annotations, the pool as its controller, the
// agent's arguments: a real agent that answers), waits until that is Ready,
// and starts the manager again.
func replacedWhileAway(orig *corev1.Pod) *corev1.Pod {
	GinkgoHelper()
	stopManager()
	<-managerDone
	Expect(k8s.Delete(ctx, orig, client.GracePeriodSeconds(0))).To(Succeed())
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(orig), &corev1.Pod{}))
	}).Should(BeTrue())
	fake := lookalike(orig, orig.Name, func(p *corev1.Pod) { p.OwnerReferences = orig.OwnerReferences })
	Eventually(func() bool {
		got := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(fake), got)).To(Succeed())
		return sandboxpod.IsReady(got)
	}).Should(BeTrue(), "the look-alike's agent runs and it is Ready")
	startManager()
	return fake
}

var _ = Describe("Pods that only look like a pool's", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("never get an Execution, a Session or a deletion; a pod the pool owns and built does (the control)", func() {
		pool := createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		real := poolPods(ns, "python")[0]
		pool = getPool(ns, "python")
		owner := metav1.OwnerReference{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxPool",
			Name: pool.Name, UID: pool.UID, Controller: ptrTo(true)}
		fakes := []*corev1.Pod{
			// The pool's labels on a plain runc pod of another image.
			lookalike(&real, "aa-runc", func(p *corev1.Pod) {
				p.Spec.RuntimeClassName = nil
				p.Spec.Containers[0].Image = "example.com/tenant/not-the-agent:1"
			}),
			// The pool as its controller too (any pod creator can write that), runc.
			lookalike(&real, "ab-owned-runc", func(p *corev1.Pod) {
				p.OwnerReferences = []metav1.OwnerReference{owner}
				p.Spec.RuntimeClassName = nil
			}),
			// Built exactly like the pool's pods, but not the pool's.
			lookalike(&real, "ac-not-owned", func(*corev1.Pod) {}),
			// The pool's, but with an agent that lets anyone in.
			lookalike(&real, "ad-no-auth", func(p *corev1.Pod) {
				p.OwnerReferences = []metav1.OwnerReference{owner}
				p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--insecure-no-auth=true")
			}),
		}
		for i := 0; i < 3; i++ {
			ex := run(wrappers.Execution(ns, fmt.Sprintf("run-%d", i)).Pool("python").Code("1 + 1").Obj())
			Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
			for _, f := range fakes {
				Expect(ex.Status.PodName).NotTo(Equal(f.Name))
			}
		}
		Expect(k8s.Create(ctx, wrappers.Session(ns, "s").Obj())).To(Succeed())
		ses := sessionIn(ns, "s", sandboxv1alpha1.SessionReady)
		for _, f := range fakes {
			Expect(ses.Status.PodName).NotTo(Equal(f.Name))
		}
		// Not deleted by the pool (neither as surplus nor as a pod to replace),
		// never claimed, unless it names the pool as its controller.
		Consistently(func(g Gomega) {
			for _, f := range fakes {
				got := &corev1.Pod{}
				err := k8s.Get(ctx, client.ObjectKeyFromObject(f), got)
				if f.OwnerReferences != nil {
					// It says it is the pool's: the pool replaces it as a pod not built right.
					g.Expect(err == nil && got.DeletionTimestamp == nil).To(BeFalse(), "pod %s is replaced", f.Name)
					continue
				}
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(got.DeletionTimestamp).To(BeNil(), "pod %s is not the pool's to delete", f.Name)
				g.Expect(lease.ClaimedBy(got)).To(BeEmpty(), "pod %s", f.Name)
				g.Expect(lease.Session(got)).To(BeEmpty(), "pod %s", f.Name)
			}
		}, 2*time.Second).Should(Succeed())
		Expect(getPool(ns, "python").Status.Replicas).To(BeNumerically("<=", 2), "the look-alikes are not counted as the pool's")

		// The control: a pod the pool owns and that is built as the pool
		// builds them is leased, so the checks above are not vacuous.
		// With the manager stopped, it becomes the pool's only idle pod.
		stopManager()
		<-managerDone
		faithful := lookalike(&real, "a0-faithful", func(p *corev1.Pod) { p.OwnerReferences = nil })
		Expect(k8s.Patch(ctx, faithful, client.RawPatch(types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":%q,"kind":"SandboxPool","name":%q,"uid":%q,"controller":true}]}}`,
				owner.APIVersion, owner.Name, owner.UID))))).To(Succeed())
		for _, p := range poolPods(ns, "python") {
			if p.Name != faithful.Name && lease.Owned(&p, pool) && lease.Session(&p) == "" {
				Expect(k8s.Delete(ctx, &p, client.GracePeriodSeconds(0))).To(Succeed())
			}
		}
		startManager()
		ex := run(wrappers.Execution(ns, "control").Pool("python").Code("2 + 2").Obj())
		Expect(ex.Status.PodName).To(Equal("a0-faithful"), "%+v", ex.Status)
	})

	It("keep serving a Session on its pod after the pool's image changed (its lease was admitted when given)", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "s").Obj())).To(Succeed())
		pod := sessionIn(ns, "s", sandboxv1alpha1.SessionReady).Status.PodName
		Expect(run(wrappers.Execution(ns, "before").Session("s").Code("kept = 'yes'").Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		changePool(ns, "python", func(p *sandboxv1alpha1.SandboxPool) { p.Spec.Image = "warmpool.dev/repl:next" })
		after := run(wrappers.Execution(ns, "after").Session("s").Code("kept").Obj())
		Expect(after.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", after.Status)
		Expect(after.Status.PodName).To(Equal(pod))
		Expect(after.Status.Result).To(Equal("'yes'"))
	})

	It("never serve a Session when made under the name of its gone pod, labels and all", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "s", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		ses := getSession(ns, "s")
		orig := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ses.Status.PodName}, orig)).To(Succeed())
		Expect(ses.Status.PodUID).To(Equal(orig.UID), "the Session records its pod's UID")

		// While the manager is away, the pod goes and a tenant makes another
		// under its name: the Session's labels and annotations, the pool as
		// controller owner, the agent's arguments (a real agent that answers).
		fake := replacedWhileAway(orig)

		// Neither the data plane nor an Execution sends it anything, and the
		// Session says its pod is gone.
		Eventually(func() error { return s.WriteFile(ctx, "secret.txt", []byte("alice's")) }).Should(
			MatchError(ContainSubstring("gone")), "the data plane refuses the look-alike")
		ex := run(wrappers.Execution(ns, "after").Session("s").Code("open('ran.txt', 'w').write('x')").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", ex.Status)
		Expect(condition(ex.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Reason).To(Equal(sandboxv1alpha1.ReasonSessionLost))
		lost := sessionIn(ns, "s", sandboxv1alpha1.SessionLost)
		Expect(condition(lost.Status.Conditions, sandboxv1alpha1.SessionConditionReady).Message).To(
			ContainSubstring("a pod now under its name is another one"))
		for _, f := range []string{"secret.txt", "ran.txt"} {
			_, err := os.Stat(filepath.Join(kubelet.Dir, ns, fake.Name, "workspace", f))
			Expect(os.IsNotExist(err)).To(BeTrue(), "%s reached the look-alike: %v", f, err)
		}
	})

	// The claimed-earlier path: a waiting Execution whose Running status was
	// lost carries on with the pod that carries its claim. Anyone who may
	// create pods can write that claim on one.
	It("never get a waiting Execution's code by carrying its claim", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(1).Obj())
		real := poolPods(ns, "python")[0]
		busy := wrappers.Execution(ns, "busy").Code("import time; time.sleep(2)").Obj()
		Expect(k8s.Create(ctx, busy)).To(Succeed())
		waitClaimed(busy)
		waiting := wrappers.Execution(ns, "waiting").Code("open('ran.txt', 'w').write('the victim code')\n'done'").Obj()
		Expect(k8s.Create(ctx, waiting)).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getExec(waiting).Status.Conditions, sandboxv1alpha1.ExecutionConditionWaitingForSandbox)
		}).Should(HaveField("Reason", sandboxv1alpha1.ReasonMaxPodsReached))
		waiting = getExec(waiting)
		claim := func(p *corev1.Pod) {
			p.Annotations = map[string]string{}
			for k, v := range real.Annotations {
				p.Annotations[k] = v
			}
			p.Annotations[sandboxpod.AnnotationClaimedUID] = string(waiting.UID)
			p.Annotations[sandboxpod.AnnotationClaimedBy] = waiting.Name
		}
		fakes := []*corev1.Pod{
			// Built exactly like the pool's pods, not the pool's.
			lookalike(&real, "aa-claims", claim),
			// runc, another image. (One that names the pool as its controller
			// is replaced by the pool as a pod not built right.)
			lookalike(&real, "ab-runc-claims", func(p *corev1.Pod) {
				claim(p)
				p.Spec.RuntimeClassName = nil
				p.Spec.Containers[0].Image = "example.com/tenant/not-the-agent:1"
			}),
		}
		refusedOf := func(pod string) OmegaMatcher {
			return ContainElement(And(HaveField("Reason", sandboxv1alpha1.ReasonSandboxRefused), HaveField("Note", ContainSubstring(pod))))
		}
		Eventually(func() []eventsv1.Event { return eventsOf(ns, "waiting") }).Should(And(refusedOf("aa-claims"), refusedOf("ab-runc-claims")),
			"the user is told of each pod that was ignored")
		done := finished(waiting)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.PodName).NotTo(Or(Equal(fakes[0].Name), Equal(fakes[1].Name)), "it ran on a pod of the pool")
		ran := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: done.Status.PodName}, ran); err == nil {
			Expect(done.Status.PodUID).To(Equal(ran.UID))
		}
		for _, f := range fakes {
			_, err := os.Stat(filepath.Join(kubelet.Dir, ns, f.Name, "workspace", "ran.txt"))
			Expect(os.IsNotExist(err)).To(BeTrue(), "the code reached the look-alike %s: %v", f.Name, err)
		}
		for _, f := range fakes {
			got := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(f), got)).To(Succeed(), "the manager did not delete %s, which it does not own", f.Name)
			Expect(got.DeletionTimestamp).To(BeNil())
		}
	})

	// Re-attach after a restart finds the pod by the name in the status: the
	// pod under that name must be the one the Execution recorded.
	It("never get a running Execution's run, its code again, or a deletion, when made under the name of its pod while the manager was away", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		log := runLog()
		ex := wrappers.Execution(ns, "running").Code(logged("running", log) + "import time\ntime.sleep(3)\n'done'").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		name := waitClaimed(ex)
		orig := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, orig)).To(Succeed())
		Expect(getExec(ex).Status.PodUID).To(Equal(orig.UID), "the Execution records its pod's UID with the claim")

		// Its labels, its claim, the pool as its controller, the agent's
		// arguments: all but the UID.
		fake := replacedWhileAway(orig)

		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), "%+v", done.Status)
		Expect(condition(done.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(HaveField("Reason", sandboxv1alpha1.ReasonSandboxLost))
		Expect(done.Status.Error.Message).To(ContainSubstring("a pod now under its name is another one"))
		Expect(done.Status.PodDisposition).To(BeEmpty(), "nothing is done to a pod that is not the Execution's")
		Expect(runCounts(log)).To(Equal(map[string]int{"running": 1}), "the code was not sent again")
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKeyFromObject(fake), &corev1.Pod{})
		}, 2*time.Second).Should(Succeed(), "the manager did not delete the look-alike as the Execution's pod")
	})

	// The delete path: an Execution deleted while it ran has its pod deleted
	// (the interrupted code's pod is suspect), found by the claim, which
	// anyone who may create pods can copy onto one of their own.
	It("are never deleted for carrying the claim of an Execution that was deleted while it ran", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		real := poolPods(ns, "python")[0]
		ex := wrappers.Execution(ns, "doomed").Code("import time; time.sleep(60)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		ran := waitClaimed(ex)
		ex = getExec(ex)
		fake := lookalike(&real, "aa-carries-the-claim", func(p *corev1.Pod) {
			p.Annotations = map[string]string{sandboxpod.AnnotationClaimedUID: string(ex.UID), sandboxpod.AnnotationClaimedBy: ex.Name}
		})
		Expect(k8s.Delete(ctx, ex)).To(Succeed())
		Eventually(func() []corev1.Pod { return poolPods(ns, "python") }).ShouldNot(ContainElement(HaveField("Name", ran)),
			"the Execution's own pod is deleted")
		Consistently(func(g Gomega) {
			got := &corev1.Pod{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(fake), got)).To(Succeed())
			g.Expect(got.DeletionTimestamp).To(BeNil())
		}, 2*time.Second).Should(Succeed(), "the manager does not delete a pod it does not own")
	})
})
