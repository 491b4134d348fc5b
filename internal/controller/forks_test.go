package controller_test

import (
	"errors"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// suiteMemoryBudget is the suite's managers' memory budget for forks,
// suspends and resumes: one namespace may hold half of it, 80 MiB, which
// takes one fork of a 52 MB Session at a time.
const suiteMemoryBudget = 160 << 20

var _ = Describe("Forks under the memory budget", func() {
	It("answers six forks of a 52 MB Session sent at once with one fork and 429s, three times, leaves no half-made fork, and another tenant's runs are answered meanwhile", func() {
		ns, other := newNamespace(), newNamespace()
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(5).Obj())
		createPoolAndWait(wrappers.Pool(other, "python").Replicas(1).Obj())
		attacker := sessionsClient(sessionUser(ns, "mallory", true))
		grantForks(ns, "mallory")
		src, err := attacker.Create(ctx, ns, "big", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		res, err := src.Run(ctx, sessions.ExecRequest{Code: "import os\nblob = os.urandom(52_000_000)\nlen(blob)"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)

		bystander, err := sessionsClient(sessionUser(other, "bob", true)).Create(ctx, other, "b", "python", nil)
		Expect(err).NotTo(HaveOccurred())

		made := 0
		for round := range 3 {
			By("round " + string(rune('1'+round)))
			var wg sync.WaitGroup
			errs := make([]error, 6)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					_, errs[i] = src.Fork(ctx, sessions.ForkRequest{Count: 1})
				}()
			}
			// The other tenant's runs go on while the forks are under way.
			stop := make(chan struct{})
			ran := make(chan int)
			go func() {
				defer GinkgoRecover()
				n := 0
				for {
					select {
					case <-stop:
						ran <- n
						return
					default:
					}
					r, err := bystander.Run(ctx, sessions.ExecRequest{Code: "1 + 1"})
					Expect(err).NotTo(HaveOccurred(), "another tenant's run during the forks")
					Expect(r.Status).To(Equal(sessions.StatusSucceeded))
					n++
				}
			}()
			wg.Wait()
			close(stop)
			Expect(<-ran).To(BeNumerically(">", 0), "the other tenant's runs were answered")

			ok, refused := 0, 0
			for _, err := range errs {
				var e *sessions.Error
				switch {
				case err == nil:
					ok++
				case errors.As(err, &e) && e.Code == http.StatusTooManyRequests:
					refused++
					Expect(e.RetryAfter).To(BeNumerically(">", 0), "a 429 says when to try again")
					Expect(e.Message).To(ContainSubstring("nothing was made"))
				default:
					Fail("a fork failed otherwise: " + err.Error())
				}
			}
			Expect(ok).To(BeNumerically(">=", 1), "the budget takes one fork at a time")
			Expect(refused).To(BeNumerically(">=", 1), "six 52 MB forks at once are more than a namespace's share of 80 MiB")
			made += ok

			By("no half-made fork: every Session is the source or a fork that has its state")
			var list sandboxv1alpha1.SessionList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			Expect(list.Items).To(HaveLen(1 + made))
			for _, s := range list.Items {
				Expect(s.Annotations).NotTo(HaveKey(sandboxv1alpha1.AnnotationRestoring), "fork %s was never restored", s.Name)
				if s.Name == "big" {
					continue
				}
				r, err := attacker.Open(ns, s.Name).Run(ctx, sessions.ExecRequest{Code: "len(blob)"})
				Expect(err).NotTo(HaveOccurred())
				Expect(*r.Result).To(Equal("52000000"), "fork %s has the source's state", s.Name)
			}
		}
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
