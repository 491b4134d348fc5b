//go:build e2e

package e2e

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// bearer adds a bearer token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// sessionCallerToken returns a token of a ServiceAccount of ns that may use
// Sessions there, for calls straight to one data-plane replica (which
// authenticates bearer tokens with a TokenReview).
func sessionCallerToken(ns string) string {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dp-caller"}}
	Expect(k8s.Create(ctx, sa)).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dp-caller"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa.Name}}})).To(Succeed())
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	Expect(k8s.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
	Expect(tr.Status.Token).NotTo(BeEmpty())
	return tr.Status.Token
}

var _ = Describe("The data plane", func() {
	It("serves a Session from each of its replicas, on the Session's one interpreter", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1))
		d := &appsv1.Deployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: "warmpool-data-plane"}, d)).To(Succeed())
		n := int(*d.Spec.Replicas)
		Expect(n).To(BeNumerically(">=", 2), "config/dataplane runs more than one replica")
		var replicas []corev1.Pod
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace("warmpool-system"),
				client.MatchingLabels{"control-plane": "data-plane"})).To(Succeed())
			replicas = nil
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Status.PodIP != "" && readyPod(&p) {
					replicas = append(replicas, p)
				}
			}
			g.Expect(replicas).To(HaveLen(n))
		}).WithTimeout(3 * time.Minute).Should(Succeed())

		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		s, err := c.Create(ctx, ns, "replicas", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(ctx) })
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "n = 0"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)

		token := sessionCallerToken(ns)
		for i, m := range replicas {
			hc := &http.Client{Transport: &bearer{token: token, next: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}} //nolint:gosec // each replica's own serving certificate
			direct := c.WithDataPlane(fmt.Sprintf("https://%s:9443", m.Status.PodIP), hc).Open(ns, s.Name)
			res, err := direct.Run(ctx, sessions.ExecRequest{Code: "n += 1\nn"})
			Expect(err).NotTo(HaveOccurred(), "replica %s", m.Name)
			Expect(res.Status).To(Equal(sessions.StatusSucceeded), "replica %s: %+v", m.Name, res.Error)
			Expect(*res.Result).To(Equal(fmt.Sprint(i+1)), "replica %s runs on the Session's interpreter", m.Name)
		}
		ses, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
	})

	It("keeps a Ready Session running code while the controllers' leader is killed, and while no controller runs at all", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1))
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		s, err := c.Create(ctx, ns, "through-leader", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(ctx) })
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "n = 0"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		before, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		oldLeader := leaderPod()
		Expect(oldLeader).NotTo(BeEmpty(), "the controllers have a leader")

		// One caller runs code without pause, through kube-apiserver's
		// aggregator and the data plane's Service, as an agent would; each run
		// counts n up by one, so a run lost or run twice shows in the result.
		var mu sync.Mutex
		var ok int
		var failures []string
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.Run(ctx, sessions.ExecRequest{Code: "n += 1\nn"})
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
				case res.Status != sessions.StatusSucceeded || res.Result == nil || *res.Result != fmt.Sprint(ok+1):
					failures = append(failures, fmt.Sprintf("%s: %s %v %+v", time.Now().Format("15:04:05.000"), res.Status, res.Result, res.Error))
				default:
					ok++
				}
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
			}
		}()
		runs := func() int { mu.Lock(); defer mu.Unlock(); return ok }

		By("killing the leader")
		Eventually(runs).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 5))
		Expect(killLeader()).To(BeTrue())
		Eventually(func() string { return leaderPod() }).WithTimeout(2*time.Minute).WithPolling(time.Second).
			ShouldNot(Or(BeEmpty(), Equal(oldLeader)), "another replica takes the lease")
		changed := runs()
		Eventually(runs).WithTimeout(time.Minute).Should(BeNumerically(">=", changed+10), "runs under the new leader")

		By("scaling the controllers to 0")
		DeferCleanup(func() { scaleManager(managerReplicas) })
		scaleManager("0")
		stopped := runs()
		Eventually(runs).WithTimeout(time.Minute).Should(BeNumerically(">=", stopped+20), "runs with no controller at all")
		close(stop)
		<-done
		scaleManager(managerReplicas)

		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(GinkgoWriter, "%d runs succeeded, %d failed\n", ok, len(failures))
		Expect(failures).To(BeEmpty(), "%d runs succeeded", ok)
		after, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
		Expect(after.Status.PodName).To(Equal(before.Status.PodName), "the Session kept its pod")
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "n"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal(fmt.Sprint(ok)), "every run ran once, in order, on the one interpreter")
	})
})

// leaderPod is the pod that holds the controllers' lease, "" when none does.
func leaderPod() string {
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: "manager.warmpool.dev"}, lease); err != nil ||
		lease.Spec.HolderIdentity == nil {
		return ""
	}
	pod, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
	return pod
}

func readyPod(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
