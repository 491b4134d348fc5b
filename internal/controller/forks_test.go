package controller_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/forkstorm"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// suiteMemoryBudget is the suite's managers' memory budget for forks,
// suspends and resumes: one namespace may hold half of it, 80 MiB, which
// takes one 52 MB fork at a time.
const suiteMemoryBudget = 160 << 20

var _ = Describe("Forks under the memory budget", func() {
	It("answers six forks of three 52 MB Sessions sent at once, three times, with what the budget takes and 429s, leaves no half-made fork, and another tenant's runs are answered meanwhile", func() {
		ns, other := newNamespace(), newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(8).Obj()) // three sources, and forks
		createPoolAndWait(wrappers.Pool(other, "python").Replicas(1).Obj())
		attacker := sessionsClient(sessionUser(ns, "mallory", true))
		grantForks(ns, "mallory")
		var srcs []*sessions.Session
		for _, name := range []string{"big-1", "big-2", "big-3"} {
			src, err := attacker.Create(ctx, ns, name, "python", nil)
			Expect(err).NotTo(HaveOccurred())
			res, err := src.Run(ctx, sessions.ExecRequest{Code: forkstorm.BigState})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
			srcs = append(srcs, src)
		}
		bystander, err := sessionsClient(sessionUser(other, "bob", true)).Create(ctx, other, "b", "python", nil)
		Expect(err).NotTo(HaveOccurred())

		made, budget := 0, 0
		for range 3 {
			out := forkstorm.Round(ctx, srcs, 2, bystander)
			Expect(out.Failed).To(BeEmpty(), "every fork is made or refused")
			Expect(out.BystanderErr).NotTo(HaveOccurred(), "another tenant's run during the forks")
			Expect(out.BystanderRuns).To(BeNumerically(">", 0))
			Expect(out.Made).To(BeNumerically(">=", 1))
			for _, e := range out.Refused {
				Expect(e.Code).To(Equal(http.StatusTooManyRequests), "%v", e)
				Expect(e.RetryAfter).To(BeNumerically(">", 0), "a 429 says when to try again")
				Expect(e.Message).To(ContainSubstring("nothing was made"))
				if strings.Contains(e.Message, "holds its share") {
					budget++
				}
			}
			made += out.Made

			By("no half-made fork: every Session is a source or a fork that has its state")
			var list sandboxv1alpha1.SessionList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			Expect(list.Items).To(HaveLen(len(srcs) + made))
			for _, s := range list.Items {
				Expect(s.Annotations).NotTo(HaveKey(sandboxv1alpha1.AnnotationRestoring), "fork %s was never restored", s.Name)
				r, err := attacker.Open(ns, s.Name).Run(ctx, sessions.ExecRequest{Code: "len(blob)"})
				Expect(err).NotTo(HaveOccurred())
				Expect(*r.Result).To(Equal("52000000"), "Session %s has the state", s.Name)
			}
		}
		// Forks of three Sessions overlap (each holds its snapshot until
		// its fork is restored), and two 52 MB at once are more than a
		// namespace's share of 80 MiB. Without the budget: none.
		Expect(budget).To(BeNumerically(">=", 1), "the budget refused a fork that would have held a second 52 MB")
	})

	It("closes a Session that waits for its state from a snapshot that never comes (a fork its data plane left part-way)", func() {
		autoscaleClock.freeze()
		ns := newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(1).Obj())
		ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big-fork-x",
			Annotations: map[string]string{sandboxv1alpha1.AnnotationRestoring: "big", sandboxv1alpha1.AnnotationForkedFrom: "big"}},
			Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.PoolReference{Name: "python"}}}
		Expect(k8s.Create(ctx, ses)).To(Succeed())
		sessionIn(ns, ses.Name, sandboxv1alpha1.SessionReady)
		autoscaleClock.step(4 * time.Minute)
		poke(ses)
		Consistently(func() sandboxv1alpha1.SessionPhase { return getSession(ns, ses.Name).Status.Phase }, 2*time.Second).
			Should(Equal(sandboxv1alpha1.SessionReady), "within its deadline it waits")
		autoscaleClock.step(time.Minute + time.Second)
		poke(ses)
		closed := sessionIn(ns, ses.Name, sandboxv1alpha1.SessionClosed)
		Expect(condition(closed.Status.Conditions, sandboxv1alpha1.SessionConditionReady)).To(And(
			HaveField("Reason", sandboxv1alpha1.ReasonNeverRestored), HaveField("Message", ContainSubstring("was not given it within 5m0s"))))
	})
})

// grantForks lets user fork Sessions of ns (sessions/fork).
func grantForks(ns, user string) {
	GinkgoHelper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-forks"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{sessions.Group}, Resources: []string{"sessions/fork"}, Verbs: []string{"create"}}}}
	Expect(k8s.Create(ctx, role)).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-forks"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}})).To(Succeed())
}

// poke changes a Session's annotations: an event that wakes its reconcile
// where the wall clock's timer would, under the frozen clock.
func poke(ses *sandboxv1alpha1.Session) {
	GinkgoHelper()
	Expect(k8s.Patch(ctx, &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: ses.Namespace, Name: ses.Name}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test.warmpool.dev/poke":"`+time.Now().Format(time.RFC3339Nano)+`"}}}`)))).To(Succeed())
}
