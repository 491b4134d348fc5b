package controller_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

func getSession(ns, name string) *sandboxv1alpha1.Session {
	s := &sandboxv1alpha1.Session{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
	return s
}

// sessionIn waits until the Session reaches phase and returns it.
func sessionIn(ns, name string, phase sandboxv1alpha1.SessionPhase) *sandboxv1alpha1.Session {
	GinkgoHelper()
	Eventually(func() sandboxv1alpha1.SessionPhase { return getSession(ns, name).Status.Phase }, 20*time.Second).Should(Equal(phase))
	return getSession(ns, name)
}

// closeSession sets spec.close the way a user would: a patch of that field alone.
func closeSession(ns, name string) {
	GinkgoHelper()
	s := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(k8s.Patch(ctx, s, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"close":true}}`)))).To(Succeed())
}

func sessionPodGone(ns, name string) func() bool {
	return func() bool {
		p := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)
		return err != nil || p.DeletionTimestamp != nil
	}
}

var _ = Describe("Session", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("deletes ended Sessions after their TTL, their own or their pool's, and keeps the others", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(3).SessionTTL(2).Obj())
		for _, s := range []*sandboxv1alpha1.Session{
			wrappers.Session(ns, "own").TTL(0).Obj(),
			wrappers.Session(ns, "pools").Obj(),
			wrappers.Session(ns, "kept").TTL(3600).Obj(),
		} {
			Expect(k8s.Create(ctx, s)).To(Succeed())
			sessionIn(ns, s.Name, sandboxv1alpha1.SessionReady)
			closeSession(ns, s.Name)
		}
		gone := func(name string) func() bool {
			return func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sandboxv1alpha1.Session{}))
			}
		}
		Eventually(gone("own")).Should(BeTrue(), "its own TTL of 0")
		kept := sessionIn(ns, "kept", sandboxv1alpha1.SessionClosed)
		Expect(kept.Status.EndTime).NotTo(BeNil())
		Eventually(gone("pools"), 10*time.Second).Should(BeTrue(), "the pool's TTL of 2 s")
		Consistently(gone("kept"), 2*time.Second).Should(BeFalse(), "its own TTL of an hour")
	})

	It("leases a warm pod, applies its context and env once, runs its Executions with shared state, and frees the pod when deleted", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		ses := wrappers.Session(ns, "nb").Context("the context").Env("GREETING", "hi").Obj()
		Expect(k8s.Create(ctx, ses)).To(Succeed())
		ready := sessionIn(ns, "nb", sandboxv1alpha1.SessionReady)
		Expect(ready.Status.PodName).NotTo(BeEmpty())
		Expect(ready.Status.Interpreter).NotTo(BeEmpty())
		Expect(ready.Status.ReadyTime).NotTo(BeNil())
		Expect(condition(ready.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonSandboxClaimed)))
		pod := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ready.Status.PodName}, pod)).To(Succeed())
		Expect(lease.Session(pod)).To(Equal("nb"))
		Expect(lease.ClaimedBy(pod)).To(BeEmpty(), "free for the session's runs")

		first := run(wrappers.Execution(ns, "s-1").Session("nb").Code("import os\nx = 41\n(context, os.environ['GREETING'])").Obj())
		Expect(first.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", first.Status)
		Expect(first.Status.Result).To(Equal("('the context', 'hi')"))
		Expect(first.Status.PodName).To(Equal(ready.Status.PodName))
		second := run(wrappers.Execution(ns, "s-2").Session("nb").Code("x + 1").Obj())
		Expect(second.Status.Result).To(Equal("42"))
		Expect(second.Status.PodName).To(Equal(ready.Status.PodName))
		// An Execution outside the session never gets the session's pod.
		other := run(wrappers.Execution(ns, "other").Code("'x' in globals()").Obj())
		Expect(other.Status.Result).To(Equal("False"))
		Expect(other.Status.PodName).NotTo(Equal(ready.Status.PodName))

		Expect(k8s.Delete(ctx, ready)).To(Succeed())
		Eventually(sessionPodGone(ns, ready.Status.PodName), 5*time.Second).Should(BeTrue(),
			"the deleted Session's pod is freed at once (the API server says the Session is gone), not after the orphan grace")
	})

	It("is created on first use by an Execution that names it, and adopts nothing else", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := run(wrappers.Execution(ns, "first").Session("implicit").Code("y = 1").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		ses := getSession(ns, "implicit")
		Expect(ses.Spec.PoolRef.Name).To(Equal("python"))
		Expect(ses.Annotations).To(HaveKeyWithValue(sandboxv1alpha1.AnnotationCreatedFor, "first"))
		Expect(ses.Status.PodName).To(Equal(ex.Status.PodName))
	})

	It("closes after its idle timeout, frees its pod, and fails later Executions naming it", func() {
		idleClosed := testutil.ToFloat64(metrics.SessionsEnded.WithLabelValues(string(sandboxv1alpha1.SessionClosed), sandboxv1alpha1.ReasonIdleTimeout))
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "brief").IdleTimeout(2*time.Second).Obj())).To(Succeed())
		ready := sessionIn(ns, "brief", sandboxv1alpha1.SessionReady)
		Eventually(func() float64 { return testutil.ToFloat64(metrics.PoolSessions.WithLabelValues(ns, "python")) }).Should(Equal(1.0),
			"warmpool_pool_sessions counts the leased pod")
		ex := run(wrappers.Execution(ns, "in-time").Session("brief").Code("z = 1").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		closed := sessionIn(ns, "brief", sandboxv1alpha1.SessionClosed)
		Expect(condition(closed.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Status", "False"), HaveField("Reason", sandboxv1alpha1.ReasonIdleTimeout), HaveField("Message", ContainSubstring("idle for"))))
		// Not closed before 2 s of idleness after the last run.
		Expect(closed.Status.LastActivityTime).NotTo(BeNil())
		Expect(time.Since(ex.Status.CompletionTime.Time)).To(BeNumerically(">=", 2*time.Second))
		Eventually(sessionPodGone(ns, ready.Status.PodName), 20*time.Second).Should(BeTrue())
		Eventually(func() float64 {
			return testutil.ToFloat64(metrics.SessionsEnded.WithLabelValues(string(sandboxv1alpha1.SessionClosed), sandboxv1alpha1.ReasonIdleTimeout))
		}).Should(BeNumerically(">", idleClosed), "warmpool_sessions_ended_total counts it")
		Eventually(func() float64 { return testutil.ToFloat64(metrics.PoolSessions.WithLabelValues(ns, "python")) }).Should(BeZero())
		late := run(wrappers.Execution(ns, "too-late").Session("brief").Code("z").Obj())
		Expect(late.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(condition(late.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonSessionLost), HaveField("Message", ContainSubstring("IdleTimeout"))))
	})

	// A lease retried while the cache lagged behind its first claim can leave
	// a second pod labelled with the Session; the Session never uses it. Once
	// the Session has ended it is freed at once, not after the 30 s grace for
	// a Session that may have just claimed it.
	It("frees at once a second pod its lease left labelled, when it ends", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "s").Obj())).To(Succeed())
		ses := sessionIn(ns, "s", sandboxv1alpha1.SessionReady)
		var second *corev1.Pod
		for _, p := range poolPods(ns, "python") {
			if p.Name != ses.Status.PodName && second == nil {
				second = p.DeepCopy()
			}
		}
		Expect(second).NotTo(BeNil())
		second.Labels[sandboxpod.LabelSession] = ses.Name
		second.Labels[sandboxpod.LabelTenant] = ns
		second.Labels[sandboxpod.LabelState] = sandboxpod.StateBusy
		second.Annotations[sandboxpod.AnnotationSessionUID] = string(ses.UID)
		Expect(k8s.Update(ctx, second)).To(Succeed())
		closeSession(ns, "s")
		sessionIn(ns, "s", sandboxv1alpha1.SessionClosed)
		Eventually(sessionPodGone(ns, second.Name), 10*time.Second).Should(BeTrue())
		Eventually(sessionPodGone(ns, ses.Status.PodName), 10*time.Second).Should(BeTrue())
	})

	It("is Lost with a clear reason when its pod is deleted", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "fragile").Obj())).To(Succeed())
		ready := sessionIn(ns, "fragile", sandboxv1alpha1.SessionReady)
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ready.Status.PodName}})).To(Succeed())
		lost := sessionIn(ns, "fragile", sandboxv1alpha1.SessionLost)
		Expect(condition(lost.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonSandboxLost), HaveField("Message", ContainSubstring(ready.Status.PodName))))
	})

	It("is Lost without taking a pod when its JSON context does not parse", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "bad-json").ContextJSON(`{"n": 3`).Obj())).To(Succeed())
		lost := sessionIn(ns, "bad-json", sandboxv1alpha1.SessionLost)
		Expect(condition(lost.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonContextFailed), HaveField("Message", ContainSubstring("not valid JSON"))))
		Expect(lost.Status.PodName).To(BeEmpty())
		for _, p := range poolPods(ns, "python") {
			Expect(lease.Session(p.DeepCopy())).To(BeEmpty(), "pod %s was leased for a Session that could never be Ready", p.Name)
		}
		Expect(idleReady(ns, "python")).To(Equal(1), "the warm pod is still warm")
	})

	It("is Lost, saying why, when its pod stays not Ready and its agent answers nothing, and frees the pod", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "hung").Obj())).To(Succeed())
		ready := sessionIn(ns, "hung", sandboxv1alpha1.SessionReady)
		thaw, ok := kubelet.FreezeAgent(ns, ready.Status.PodName)
		Expect(ok).To(BeTrue())
		DeferCleanup(thaw)
		// As the kubelet reports a pod whose readiness probe has failed for a
		// while: once the claim, which may land just after Ready, is on the pod.
		pod := &corev1.Pod{}
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ready.Status.PodName}, pod); err != nil {
				return err
			}
			if lease.Session(pod) != "hung" {
				return fmt.Errorf("pod %s does not carry the Session's claim yet", pod.Name)
			}
			for i := range pod.Status.Conditions {
				if pod.Status.Conditions[i].Type == corev1.PodReady {
					pod.Status.Conditions[i].Status = corev1.ConditionFalse
					pod.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-40 * time.Second))
				}
			}
			return k8s.Status().Update(ctx, pod)
		}).Should(Succeed())
		lost := sessionIn(ns, "hung", sandboxv1alpha1.SessionLost)
		Expect(condition(lost.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonSandboxLost),
			HaveField("Message", And(ContainSubstring(pod.Name), ContainSubstring("has not been Ready for")))))
		Eventually(sessionPodGone(ns, pod.Name), 20*time.Second).Should(BeTrue())
	})

	It("closes at its maximum lifetime however busy, and spec.close closes at once", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "bounded").MaxLifetime(2*time.Second).Obj())).To(Succeed())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "closing").Obj())).To(Succeed())
		sessionIn(ns, "bounded", sandboxv1alpha1.SessionReady)
		closing := sessionIn(ns, "closing", sandboxv1alpha1.SessionReady)
		closed := sessionIn(ns, "bounded", sandboxv1alpha1.SessionClosed)
		Expect(condition(closed.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(HaveField("Reason", sandboxv1alpha1.ReasonMaxLifetime))
		closeSession(ns, "closing")
		done := sessionIn(ns, "closing", sandboxv1alpha1.SessionClosed)
		Expect(condition(done.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(HaveField("Reason", sandboxv1alpha1.ReasonClosed))
		Eventually(sessionPodGone(ns, closing.Status.PodName), 20*time.Second).Should(BeTrue())
	})

	It("gives its pod back to the pool with a fresh interpreter under reusePolicy FreshInterpreter", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").MaxPods(1).Reuse(sandboxv1alpha1.ReuseFreshInterpreter).Obj())
		Expect(k8s.Create(ctx, wrappers.Session(ns, "reused").Obj())).To(Succeed())
		ready := sessionIn(ns, "reused", sandboxv1alpha1.SessionReady)
		Expect(run(wrappers.Execution(ns, "set").Session("reused").Code("secret = 7").Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		closeSession(ns, "reused")
		sessionIn(ns, "reused", sandboxv1alpha1.SessionClosed)
		// maxPods 1: the next Execution can only run on the same pod, reset.
		next := run(wrappers.Execution(ns, "after").Code("'secret' in globals()").Obj())
		Expect(next.Status.PodName).To(Equal(ready.Status.PodName))
		Expect(next.Status.Result).To(Equal("False"), "the Session's state must not survive into the next user's run")
	})

	It("waits, saying why, while its pool is missing, and stays Ready across a manager restart", func() {
		Expect(k8s.Create(ctx, wrappers.Session(ns, "early").Obj())).To(Succeed())
		Eventually(func() *metaCondition {
			return condition(getSession(ns, "early").Status.Conditions, sandboxv1alpha1.SessionConditionReady)
		}).Should(And(HaveField("Status", "False"), HaveField("Reason", sandboxv1alpha1.ReasonPoolNotFound)))
		Expect(getSession(ns, "early").Status.Phase).To(Equal(sandboxv1alpha1.SessionPending))
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ready := sessionIn(ns, "early", sandboxv1alpha1.SessionReady)
		Expect(run(wrappers.Execution(ns, "before").Session("early").Code("v = 'kept'").Obj()).Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded))
		restartManager()
		after := run(wrappers.Execution(ns, "after").Session("early").Code("v").Obj())
		Expect(after.Status.Result).To(Equal("'kept'"))
		Expect(after.Status.PodName).To(Equal(ready.Status.PodName))
		Expect(getSession(ns, "early").Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelSession: "early"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(1), "one pod per Session, across restarts")
	})
})
