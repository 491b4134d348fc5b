//go:build e2e

package e2e

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
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

var _ = Describe("Two manager replicas", func() {
	It("serve the data plane from each replica, leader or not, on the Session's one interpreter", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1))
		n, err := strconv.Atoi(managerReplicas)
		Expect(err).NotTo(HaveOccurred())
		var managers []corev1.Pod
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace("warmpool-system"),
				client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
			managers = nil
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Status.PodIP != "" && readyPod(&p) {
					managers = append(managers, p)
				}
			}
			g.Expect(managers).To(HaveLen(n))
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
		for i, m := range managers {
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
})

func readyPod(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
