package controller_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// latestSnapshot is the Session's newest snapshot in the store, read with
// the manager's own key.
func latestSnapshot(ses *sandboxv1alpha1.Session) func() (snapshotstore.Info, error) {
	return func() (snapshotstore.Info, error) {
		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: snapshotstore.DefaultKeySecret}, secret); err != nil {
			return snapshotstore.Info{}, err
		}
		st, err := snapshotstore.New(snapshotStore.Config(snapshotBucket, "warmpool/"), secret.Data["key"])
		if err != nil {
			return snapshotstore.Info{}, err
		}
		return st.Latest(ctx, snapshotstore.Owner{Namespace: ses.Namespace, UID: ses.UID})
	}
}

func readyReason(ns, name string) string {
	if c := condition(getSession(ns, name).Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

var _ = Describe("Durable Sessions", func() {
	It("resume from their last checkpoint when their node or pod is lost, and their next run says which run the state is from; plain ones end Lost", func() {
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(3).Obj())
		a := readyNode(ns + "-a")
		// every: a checkpoint after every run; hourly: one at Ready, then
		// none within the spec; plain: none at all.
		for _, s := range []*sandboxv1alpha1.Session{wrappers.Session(ns, "every").Checkpoint(0).Obj(),
			wrappers.Session(ns, "hourly").Checkpoint(time.Hour).Obj(), wrappers.Session(ns, "plain").Obj()} {
			Expect(k8s.Create(ctx, s)).To(Succeed())
		}
		c := sessionsClient(sessionUser(ns, "alice", true))
		every, hourly, plain := c.Open(ns, "every"), c.Open(ns, "hourly"), c.Open(ns, "plain")
		runOK := func(s *sessions.Session, code string) *sessions.Result {
			GinkgoHelper()
			res, err := s.Run(ctx, sessions.ExecRequest{Code: code})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%q: %+v", code, res)
			return res
		}
		Expect(runOK(every, "x = 1").Run).To(BeEquivalentTo(1))
		res := runOK(every, "x += 10\nx")
		Expect(res.Result).To(HaveValue(Equal("11")))
		Expect(res.Run).To(BeEquivalentTo(2))
		// hourly's one checkpoint is the one at Ready, before its runs.
		Eventually(latestSnapshot(getSession(ns, "hourly")), 20*time.Second).Should(HaveField("Run", BeEquivalentTo(0)))
		runOK(hourly, "y = 5")
		runOK(hourly, "y += 1")
		runOK(plain, "z = 1")
		// The checkpoint after run 2 is in the store: no API write was
		// needed for it (its status follows within seconds).
		Eventually(latestSnapshot(getSession(ns, "every")), 20*time.Second).Should(HaveField("Run", BeEquivalentTo(2)))
		Eventually(func() *sandboxv1alpha1.SessionSnapshot { return getSession(ns, "every").Status.Checkpoint }, 30*time.Second).
			Should(And(Not(BeNil()), HaveField("Run", BeEquivalentTo(2))), "status.checkpoint follows the store")
		Consistently(latestSnapshot(getSession(ns, "hourly")), time.Second).Should(HaveField("Run", BeEquivalentTo(0)), "hourly: no checkpoint within its interval")

		// every's node stops answering; hourly's and plain's pods are deleted.
		everyPod := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: getSession(ns, "every").Status.PodName}, everyPod)).To(Succeed())
		bind(everyPod, a.Name)
		hourlyPod, plainPod := getSession(ns, "hourly").Status.PodName, getSession(ns, "plain").Status.PodName
		lost := loseNode(a)
		for _, name := range []string{hourlyPod, plainPod} {
			Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.GracePeriodSeconds(0))).To(Succeed())
		}
		var toRecovered time.Duration
		Eventually(func() string {
			r := readyReason(ns, "every")
			if r == sandboxv1alpha1.ReasonRecovered && toRecovered == 0 {
				toRecovered = time.Since(lost)
			}
			return r
		}, 30*time.Second).WithPolling(10 * time.Millisecond).Should(Equal(sandboxv1alpha1.ReasonRecovered))
		GinkgoWriter.Printf("node lost -> durable Session Ready again from its checkpoint, seen after %s\n", toRecovered)
		Eventually(func() string { return readyReason(ns, "hourly") }, 30*time.Second).Should(Equal(sandboxv1alpha1.ReasonRecovered))
		Eventually(func() sandboxv1alpha1.SessionPhase { return getSession(ns, "plain").Status.Phase }, 30*time.Second).
			Should(Equal(sandboxv1alpha1.SessionLost))

		ses := getSession(ns, "every")
		Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(ses.Status.PodName).NotTo(Equal(everyPod.Name))
		Expect(ses.Status.LastMove).NotTo(BeNil())
		Expect(ses.Status.LastMove.FromNode).To(Equal(a.Name))
		Expect(ses.Status.LastMove.Reason).To(Equal(sandboxv1alpha1.ReasonNodeLost))
		Expect(ses.Status.LastMove.Checkpoint).To(HaveField("Run", BeEquivalentTo(2)))
		Expect(condition(ses.Status.Conditions, sandboxv1alpha1.SessionConditionReady).Message).
			To(ContainSubstring("from its checkpoint after run 2"))
		Expect(eventsOf(ns, "every")).To(ContainElement(HaveField("Reason", sandboxv1alpha1.ReasonRecovering)))

		// The state is the checkpoint's, and the run says so, once.
		res = runOK(every, "x")
		Expect(res.Result).To(HaveValue(Equal("11")))
		Expect(res.Run).To(BeEquivalentTo(3))
		Expect(res.Moved).NotTo(BeNil(), "the first run after the recovery does not say it")
		Expect(res.Moved.Checkpoint).NotTo(BeNil())
		Expect(res.Moved.Run).To(BeEquivalentTo(2))
		Expect(res.Moved.FromNode).To(Equal(a.Name))
		Expect(res.Moved.Reason).To(Equal(sandboxv1alpha1.ReasonNodeLost))
		Expect(runOK(every, "x").Moved).To(BeNil())

		// hourly's last checkpoint is from before its two runs: they are to be redone.
		res, err := hourly.Run(ctx, sessions.ExecRequest{Code: "y"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusFailed), "y was set after the last checkpoint")
		Expect(res.Moved).NotTo(BeNil())
		Expect(res.Moved.Run).To(BeEquivalentTo(0))
		Expect(res.Run).To(BeEquivalentTo(1))
		Expect(eventsOf(ns, "hourly")).To(ContainElement(And(HaveField("Reason", sandboxv1alpha1.ReasonRecovering),
			HaveField("Note", ContainSubstring(fmt.Sprintf("Pod %s lost", hourlyPod))))))

		gone := condition(getSession(ns, "plain").Status.Conditions, sandboxv1alpha1.SessionConditionReady)
		Expect(gone.Reason).To(Equal(sandboxv1alpha1.ReasonSandboxLost))
		Expect(gone.Message).NotTo(ContainSubstring("checkpoint"))
	})
})
