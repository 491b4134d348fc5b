package controller_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// readyNode creates a Ready node for the spec (envtest has none: its pods
// run on the local kubelet, bound to no node until a spec binds them).
func readyNode(name string) *corev1.Node {
	GinkgoHelper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	Expect(k8s.Create(ctx, n)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(ctx, n) })
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	Expect(k8s.Status().Update(ctx, n)).To(Succeed())
	// The API server taints a new node not-ready; on a cluster, the node
	// lifecycle controller (not run here) lifts it once the node is Ready.
	Eventually(func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return err
		}
		n.Spec.Taints = nil
		return k8s.Update(ctx, n)
	}).Should(Succeed())
	return n
}

// bind places a pod on a node, as the scheduler does.
func bind(pod *corev1.Pod, node string) {
	GinkgoHelper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	Expect(k8s.SubResource("binding").Create(ctx, pod, b)).To(Succeed())
}

var _ = Describe("Pools across nodes", func() {
	It("hands out no pod on a cordoned node, replaces the warm ones there, and keeps the Sessions that were on it, with their state", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		a, b := readyNode(ns+"-a"), readyNode(ns+"-b")
		Expect(k8s.Create(ctx, wrappers.Session(ns, "before").Obj())).To(Succeed())
		before := sessionIn(ns, "before", sandboxv1alpha1.SessionReady)
		Expect(run(wrappers.Execution(ns, "state").Session("before").Code("v = 7").Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Eventually(func() int { return idleReady(ns, "python") }).Should(Equal(2))
		var onA *corev1.Pod
		for _, p := range poolPods(ns, "python") {
			switch {
			case p.Name == before.Status.PodName:
				bind(&p, a.Name)
			case onA == nil:
				onA = p.DeepCopy()
				bind(&p, a.Name)
			default:
				bind(&p, b.Name)
			}
		}
		// The warm pod on a stays, as a delete that does not get through: the
		// dispatcher alone must keep it from new work.
		stays := func(p *corev1.Pod) bool { return p.Namespace == ns && p.Name == onA.Name }
		podDeleteFails.Store(&stays)
		DeferCleanup(func() { podDeleteFails.Store(nil) })

		cordoned := a.DeepCopy()
		cordoned.Spec.Unschedulable = true
		Expect(k8s.Patch(ctx, cordoned, client.MergeFrom(a))).To(Succeed())
		Eventually(func() []string {
			var why []string
			for _, e := range eventsOf(ns, "python") {
				if e.Reason == sandboxv1alpha1.ReasonPodsDisplaced {
					why = append(why, e.Note)
				}
			}
			return why
		}).Should(ContainElement(ContainSubstring(fmt.Sprintf("node %s is cordoned", a.Name))))

		// Two new Sessions: the warm pod on b and a new one, never the pod on a.
		for i := range 2 {
			Expect(k8s.Create(ctx, wrappers.Session(ns, fmt.Sprintf("after-%d", i)).Obj())).To(Succeed())
		}
		for i := range 2 {
			s := sessionIn(ns, fmt.Sprintf("after-%d", i), sandboxv1alpha1.SessionReady)
			Expect(s.Status.PodName).NotTo(Equal(onA.Name), "a Session was placed on the cordoned node")
		}
		// The Session that was on a before the cordon still answers, with its
		// state (it moved: "Sessions on a drained node").
		ran := run(wrappers.Execution(ns, "still-there").Session("before").Code("v").Obj())
		Expect(ran.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		Expect(ran.Status.Result).To(Equal("7"))
		Expect(ran.Status.PodName).NotTo(Equal(onA.Name))

		// Once its delete gets through, the warm pod on a goes.
		podDeleteFails.Store(nil)
		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, client.ObjectKeyFromObject(onA), p)
			return apierrors.IsNotFound(err) || p.DeletionTimestamp != nil
		}).Should(BeTrue(), "the warm pod on the cordoned node is replaced")
	})
})

var _ = Describe("Sessions on a drained node", func() {
	It("moves a Session off a cordoned node once its running step ends, with its state, under the same name", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		a, b := readyNode(ns+"-a"), readyNode(ns+"-b")
		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "mover", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "x = 41"})
		Expect(err).NotTo(HaveOccurred())
		old := getSession(ns, "mover").Status.PodName
		for _, p := range poolPods(ns, "python") {
			if p.Name == old {
				bind(&p, a.Name)
			} else {
				bind(&p, b.Name)
			}
		}
		// A step under way when the node is cordoned finishes first.
		step := wrappers.Execution(ns, "step").Session("mover").Code("import time\ntime.sleep(2.5)\nprint('step done')").Obj()
		Expect(k8s.Create(ctx, step)).To(Succeed())
		waitClaimed(step)
		cordoned := a.DeepCopy()
		cordoned.Spec.Unschedulable = true
		Expect(k8s.Patch(ctx, cordoned, client.MergeFrom(a))).To(Succeed())

		done := finished(step)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "the move waits for the running step")
		Expect(done.Status.Stdout).To(Equal("step done\n"))
		var moved *sandboxv1alpha1.Session
		Eventually(func() string {
			moved = getSession(ns, "mover")
			if c := condition(moved.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil {
				return c.Reason
			}
			return ""
		}, 30*time.Second).Should(Equal(sandboxv1alpha1.ReasonMoved))
		Expect(moved.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(moved.Status.PodName).NotTo(Equal(old))
		Expect(moved.Status.Moves).To(BeEquivalentTo(1))
		Expect(moved.Status.LastMove).NotTo(BeNil())
		Expect(moved.Status.LastMove.FromNode).To(Equal(a.Name))
		Expect(moved.Status.LastMove.Reason).To(ContainSubstring("is cordoned"))
		Expect(moved.Status.LastMove.EndTime).NotTo(BeNil())
		Expect(moved.Status.LastMove.StartTime.Time).To(BeTemporally(">=", done.Status.CompletionTime.Time.Truncate(time.Second)))
		Expect(eventsOf(ns, "mover")).To(ContainElement(HaveField("Reason", sandboxv1alpha1.ReasonMoving)))

		// The old pod goes, so the drain can finish; the state came along.
		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: old}, p)
			return apierrors.IsNotFound(err) || p.DeletionTimestamp != nil
		}).Should(BeTrue(), "the pod on the drained node is deleted")
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "x + 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Result).To(HaveValue(Equal("42")))
		Expect(getSession(ns, "mover").Status.PodName).To(Equal(moved.Status.PodName))
		// That run says it moved, and from where; the next one does not.
		Expect(res.Moved).NotTo(BeNil(), "the first run after the move does not say it moved")
		Expect(res.Moved.FromNode).To(Equal(a.Name))
		Expect(res.Moved.Reason).To(ContainSubstring("is cordoned"))
		Expect(res.Moved.Since).To(BeTemporally("~", moved.Status.LastMove.StartTime.Time, time.Second))
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "x"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Moved).To(BeNil())
	})
})

var _ = Describe("A Session too large to move", func() {
	It("stays on its cordoned node, serving, and says why in its Movable condition and a Warning Event", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		a := readyNode(ns + "-a")
		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "big", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		// Over the manager's snapshot limit (64 MiB by default).
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "import os\nblob = os.urandom(70 << 20)\nx = 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		pod := getSession(ns, "big").Status.PodName
		for _, p := range poolPods(ns, "python") {
			if p.Name == pod {
				bind(&p, a.Name)
			}
		}
		cordoned := a.DeepCopy()
		cordoned.Spec.Unschedulable = true
		Expect(k8s.Patch(ctx, cordoned, client.MergeFrom(a))).To(Succeed())

		Eventually(func() *metaCondition {
			return condition(getSession(ns, "big").Status.Conditions, sandboxv1alpha1.SessionConditionMovable)
		}, 60*time.Second).Should(And(Not(BeNil()), HaveField("Status", "False"), HaveField("Reason", sandboxv1alpha1.ReasonTooLargeToMove),
			HaveField("Message", And(ContainSubstring("is cordoned"), ContainSubstring("over the snapshot limit"), ContainSubstring(pod)))))
		Eventually(func() any { return eventsOf(ns, "big") }).Should(ContainElement(And(HaveField("Type", corev1.EventTypeWarning),
			HaveField("Reason", sandboxv1alpha1.ReasonTooLargeToMove))))
		// It stays where it is, with its state, and serves.
		ses := getSession(ns, "big")
		Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(ses.Status.PodName).To(Equal(pod))
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "x"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Result).To(HaveValue(Equal("1")))
		Expect(res.Moved).To(BeNil())
	})
})

// loseNode marks a node as the node lifecycle controller does when its
// kubelet stops posting status (not run in envtest): Ready Unknown, and the
// unreachable taint. It returns when that was stored.
func loseNode(n *corev1.Node) time.Time {
	GinkgoHelper()
	Eventually(func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return err
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
			Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status.",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		return k8s.Status().Update(ctx, n)
	}).Should(Succeed())
	lost := time.Now()
	Eventually(func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return err
		}
		n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: lost}}}
		return k8s.Update(ctx, n)
	}).Should(Succeed())
	return lost
}

var _ = Describe("Nodes that stop answering", func() {
	It("ends a run there SandboxLost and never runs it again, loses its Sessions naming the node, and runs what had not started elsewhere, once", func() {
		ns := newNamespace()
		// Two pods at most: a Session and a run hold them, and a third
		// Execution waits for one.
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(2).Obj())
		a := readyNode(ns + "-a")
		Expect(k8s.Create(ctx, wrappers.Session(ns, "plain").Obj())).To(Succeed())
		Expect(run(wrappers.Execution(ns, "state").Session("plain").Code("v = 7").Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		dir := GinkgoT().TempDir()
		runLog, waitLog := filepath.Join(dir, "runs"), filepath.Join(dir, "waited")
		long := wrappers.Execution(ns, "long").Timeout(time.Minute).
			Code(fmt.Sprintf("import time\nopen(%q, 'a').write('ran\\n')\ntime.sleep(50)", runLog)).Obj()
		Expect(k8s.Create(ctx, long)).To(Succeed())
		waitClaimed(long)
		Eventually(func() error { _, err := os.Stat(runLog); return err }).Should(Succeed(), "the long run started")
		waiting := wrappers.Execution(ns, "waiting").Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\nprint('waited')", waitLog)).Obj()
		Expect(k8s.Create(ctx, waiting)).To(Succeed())
		Consistently(func() sandboxv1alpha1.ExecutionPhase { return getExec(waiting).Status.Phase }, time.Second).
			Should(BeElementOf(sandboxv1alpha1.PhasePending, sandboxv1alpha1.ExecutionPhase("")), "no pod is free for it yet")
		var onA []string
		for _, p := range poolPods(ns, "python") {
			bind(&p, a.Name)
			onA = append(onA, p.Name)
		}

		lost := loseNode(a)
		// Each final word's time is when this spec saw it (statuses store
		// whole seconds), both watched at once.
		var toRun, toSession time.Duration
		Eventually(func() bool {
			if toRun == 0 && getExec(long).Status.Phase.IsFinished() {
				toRun = time.Since(lost)
			}
			if toSession == 0 && getSession(ns, "plain").Status.Phase == sandboxv1alpha1.SessionLost {
				toSession = time.Since(lost)
			}
			return toRun > 0 && toSession > 0
		}).WithPolling(10 * time.Millisecond).Should(BeTrue())
		GinkgoWriter.Printf("node lost -> final word seen: running Execution %s, Session %s\n", toRun, toSession)
		done := getExec(long)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(done.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Reason).To(Equal(sandboxv1alpha1.ReasonSandboxLost))
		Expect(done.Status.Error.Message).To(ContainSubstring(fmt.Sprintf("node %s stopped answering", a.Name)))
		Expect(done.Status.Error.Message).To(ContainSubstring("not run again"))

		ses := getSession(ns, "plain")
		ready := condition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady)
		Expect(ready.Reason).To(Equal(sandboxv1alpha1.ReasonNodeLost))
		Expect(ready.Message).To(ContainSubstring(fmt.Sprintf("node %s stopped answering", a.Name)))

		// The Execution that had not started runs off the lost node, once.
		next := finished(waiting)
		Expect(next.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", next.Status)
		Expect(next.Status.Stdout).To(Equal("waited\n"))
		Expect(onA).NotTo(ContainElement(next.Status.PodName), "placed on the lost node")
		Expect(os.ReadFile(waitLog)).To(BeEquivalentTo("ran\n"))
		// The lost run is not sent again, anywhere.
		Consistently(func() string { b, _ := os.ReadFile(runLog); return string(b) }, 3*time.Second).Should(Equal("ran\n"))
	})

	It("runs elsewhere, once, an Execution claimed on a pod there whose code never reached the pod", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).MaxPods(2).Obj())
		a := readyNode(ns + "-a")
		pods := poolPods(ns, "python")
		Expect(pods).To(HaveLen(1))
		onA := pods[0].Name
		bind(&pods[0], a.Name)
		// The node's network is gone before the node is marked: the manager
		// claims the pod, and its connections to the agent are refused.
		Expect(kubelet.CutOff(ns, onA)).To(Succeed())
		runLog := filepath.Join(GinkgoT().TempDir(), "runs")
		ex := wrappers.Execution(ns, "unsent").Timeout(time.Minute).
			Code(fmt.Sprintf("open(%q, 'a').write('ran\\n')\nprint('ran')", runLog)).Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Expect(waitClaimed(ex)).To(Equal(onA))
		Consistently(func() error { _, err := os.Stat(runLog); return err }, time.Second).ShouldNot(Succeed(), "the code reached a cut-off agent")

		loseNode(a)
		done := finished(ex)
		Expect(done.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", done.Status)
		Expect(done.Status.Stdout).To(Equal("ran\n"))
		Expect(done.Status.PodName).NotTo(Equal(onA))
		Expect(eventsOf(ns, "unsent")).To(ContainElement(And(HaveField("Reason", sandboxv1alpha1.ReasonRequeued),
			HaveField("Note", And(ContainSubstring(fmt.Sprintf("node %s stopped answering", a.Name)), ContainSubstring(onA))))))
		Consistently(func() string { b, _ := os.ReadFile(runLog); return string(b) }, 2*time.Second).Should(Equal("ran\n"))
		old := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: onA}, old)
		Expect(apierrors.IsNotFound(err) || err == nil && old.DeletionTimestamp != nil).To(BeTrue(), "the pod on the lost node is not deleted")
	})
})
