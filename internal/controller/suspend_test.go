package controller_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller/session"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// snapshotIn reports whether the store holds the Session's snapshot under key.
func snapshotIn(ses *sandboxv1alpha1.Session, key string) func() error {
	return func() error {
		// With the manager's own key, from the Secret it made.
		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: snapshotstore.DefaultKeySecret}, secret); err != nil {
			return err
		}
		st, err := snapshotstore.New(snapshotStore.Config(snapshotBucket, "warmpool/"), secret.Data["key"])
		if err != nil {
			return err
		}
		_, err = st.Get(ctx, snapshotstore.Owner{Namespace: ses.Namespace, UID: ses.UID}, key)
		return err
	}
}

var _ = Describe("Session suspend", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("suspends an idle Session to the object store and frees its pod; its next run, after a manager restart, resumes it with its state", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).SessionSuspendAfter(2 * time.Second).Obj())
		Eventually(func() *metaCondition {
			return condition(getPool(ns, "python").Status.Conditions, sandboxv1alpha1.PoolConditionSessionSuspend)
		}, 10*time.Second).Should(And(HaveField("Status", "True"), HaveField("Reason", sandboxv1alpha1.ReasonSnapshotStoreConfigured)))

		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "nb", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "import json\nx = 41\ndef f():\n    return x + 1\nopen('notes.txt', 'w').write('kept')"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(res.Resumed).To(BeFalse())
		pod := getSession(ns, "nb").Status.PodName

		suspended := sessionIn(ns, "nb", sandboxv1alpha1.SessionSuspended)
		Expect(suspended.Status.PodName).To(BeEmpty())
		Expect(suspended.Status.Snapshot).NotTo(BeNil())
		Expect(suspended.Status.Snapshot.Variables).To(BeNumerically(">=", 2))
		Expect(suspended.Status.Snapshot.WorkspaceFiles).To(Equal(int32(1)))
		Expect(suspended.Finalizers).To(ContainElement(session.SnapshotFinalizer))
		Expect(condition(suspended.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(HaveField("Reason", sandboxv1alpha1.ReasonSuspended))
		Expect(snapshotIn(suspended, suspended.Status.Snapshot.Key)()).To(Succeed())
		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p)
			return err != nil || p.DeletionTimestamp != nil || lease.Session(p) == ""
		}, 10*time.Second).Should(BeTrue(), "the suspended Session's pod is freed")

		restartManager()
		// The restarted data plane refuses requests until it has loaded its keys and client CA; the code runs once.
		Eventually(func() error {
			res, err = s.Run(ctx, sessions.ExecRequest{Code: "x = 42\n(f(), json.dumps(x), open('notes.txt').read())"})
			return err
		}, 20*time.Second).Should(Succeed())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal(`(43, '42', 'kept')`), "f() reads the restored namespace itself")
		Expect(res.Resumed).To(BeTrue(), "the run says its Session was resumed for it")
		ready := getSession(ns, "nb")
		Expect(ready.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(ready.Status.Resumes).To(Equal(int32(1)))
		Expect(ready.Status.Snapshot).To(BeNil())
		Expect(condition(ready.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(HaveField("Reason", sandboxv1alpha1.ReasonResumed))
		Eventually(snapshotIn(suspended, suspended.Status.Snapshot.Key), 10*time.Second).Should(MatchError(snapshotstore.ErrNotFound),
			"the snapshot it resumed from is deleted")

		// An Execution naming the Session resumes it too.
		sessionIn(ns, "nb", sandboxv1alpha1.SessionSuspended)
		ex := run(wrappers.Execution(ns, "next").Session("nb").Code("x").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(ex.Status.Result).To(Equal("42"))
		Expect(ex.Status.SessionResumed).To(BeTrue(), "the Execution says its Session was resumed for it")
		Expect(getSession(ns, "nb").Status.Resumes).To(Equal(int32(2)))

		// Deleted, it takes its snapshots with it.
		third := sessionIn(ns, "nb", sandboxv1alpha1.SessionSuspended)
		Expect(k8s.Delete(ctx, third)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(third), &sandboxv1alpha1.Session{}))
		}, 10*time.Second).Should(BeTrue())
		Expect(snapshotIn(third, third.Status.Snapshot.Key)()).To(MatchError(snapshotstore.ErrNotFound))
	})

	It("gives back the pod of a suspended Session whose release kept failing: its pool deletes it once the Session's grace to free it is over", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).SessionSuspendAfter(2 * time.Second).Obj())
		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "nb", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "x = 1"})
		Expect(err).NotTo(HaveOccurred())
		// Frozen after the run: the agent reports its last run in wall-clock
		// time, which a clock frozen earlier would never pass (on a slow
		// machine the pool and the lease take seconds).
		autoscaleClock.freeze()
		podName := getSession(ns, "nb").Status.PodName
		fails := func(p *corev1.Pod) bool { return p.Namespace == ns && p.Name == podName }
		podDeleteFails.Store(&fails)
		DeferCleanup(func() { podDeleteFails.Store(nil) })

		autoscaleClock.step(3 * time.Second) // idle past suspendAfter
		suspended := sessionIn(ns, "nb", sandboxv1alpha1.SessionSuspended)
		Expect(suspended.Status.Snapshot).NotTo(BeNil())
		pod := &corev1.Pod{}
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: podName}, pod)
		}, 2*time.Second).Should(Succeed(), "the release fails: the sealed pod stays")
		Expect(lease.Suspending(pod)).To(BeTrue())

		// The Session controller frees its old pod for OrphanSessionPodGrace
		// after the suspend; past it, the pool does, as for any pod nobody
		// can use. The API server answers deletes again; an event stands for
		// the pool's own timer, which the frozen clock would make wait.
		autoscaleClock.step(lease.OrphanSessionPodGrace + time.Second)
		podDeleteFails.Store(nil)
		Expect(k8s.Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test.warmpool.dev/poke":"1"}}}`)))).To(Succeed())
		Eventually(func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: podName}, pod)
			return apierrors.IsNotFound(err) || pod.DeletionTimestamp != nil
		}, 20*time.Second).Should(BeTrue(), "the pool deletes the sealed pod of the suspended Session")
		Expect(getSession(ns, "nb").Status.Phase).To(Equal(sandboxv1alpha1.SessionSuspended))
	})

	It("finishes a suspend that a manager killed before the Suspended status: the Session is Ready on its sealed pod meanwhile, never neither", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).SessionSuspendAfter(2 * time.Second).Obj())
		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "nb", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "kept = 'across the crash'"})
		Expect(err).NotTo(HaveOccurred())
		crashed := make(chan struct{})
		f := func(ses *sandboxv1alpha1.Session) bool {
			if ses.Namespace == ns && ses.Status.Phase == sandboxv1alpha1.SessionSuspended {
				close(crashed)
				return true
			}
			return false
		}
		crashBeforeSessionStatus.Store(&f)
		DeferCleanup(func() { crashBeforeSessionStatus.Store(nil) })
		Eventually(crashed, 20*time.Second).Should(BeClosed())
		<-managerDone
		// The manager is down: the Session is still Ready on its (sealed) pod.
		ses := getSession(ns, "nb")
		Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(ses.Status.PodName).NotTo(BeEmpty())

		startManager()
		suspended := sessionIn(ns, "nb", sandboxv1alpha1.SessionSuspended)
		Expect(suspended.Status.Snapshot).NotTo(BeNil())
		var res *sessions.Result
		Eventually(func() error {
			res, err = s.Run(ctx, sessions.ExecRequest{Code: "kept"})
			return err
		}, 20*time.Second).Should(Succeed())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("'across the crash'"))
	})
})
