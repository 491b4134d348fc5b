//go:build e2e

package e2e

import (
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// onReplica sends one-call runs (POST .../runs/NAME/exec) straight to one data-plane
// replica, with a bearer token, and everything else through kube-apiserver:
// the replica a run lands on is known, and can be killed under it, while the
// caller still reaches the others.
type onReplica struct {
	addr      string
	direct    http.RoundTripper
	apiserver http.RoundTripper
}

func (o *onReplica) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.Contains(r.URL.Path, "/runs/") {
		return o.apiserver.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = "https", o.addr, ""
	return o.direct.RoundTrip(r)
}

// dataPlaneReplica returns a Ready data-plane pod.
func dataPlaneReplica() corev1.Pod {
	GinkgoHelper()
	var replica corev1.Pod
	Eventually(func() bool {
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace("warmpool-system"), client.MatchingLabels{"control-plane": "data-plane"})).To(Succeed())
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.PodIP != "" && readyPod(&p) {
				replica = p
				return true
			}
		}
		return false
	}).WithTimeout(3 * time.Minute).Should(BeTrue())
	return replica
}

var _ = Describe("One-call runs", func() {
	// The client of a caller whose runs land on replica, through its own
	// token (edit in ns, which aggregates the Session roles).
	clientOn := func(ns string, replica corev1.Pod) *sessions.Client {
		GinkgoHelper()
		token := sessionCallerToken(ns)
		cfg := rest.AnonymousClientConfig(restConfig)
		cfg.BearerToken = token
		apiserver, err := rest.TransportFor(cfg)
		Expect(err).NotTo(HaveOccurred())
		c, err := sessions.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		direct := &bearer{token: token, next: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the replica's own serving certificate
		return c.WithDataPlane(cfg.Host, &http.Client{Transport: &onReplica{addr: replica.Status.PodIP + ":9443", direct: direct, apiserver: apiserver}})
	}
	kill := func(p corev1.Pod) {
		GinkgoHelper()
		Expect(k8s.Delete(ctx, &p, client.GracePeriodSeconds(0))).To(Succeed())
	}

	It("lease and run in one request through kube-apiserver, and close the Session", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1))
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		var out strings.Builder
		res, s, err := c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "py", ExecRequest: sessions.ExecRequest{
			Code: "print('hello')\n6 * 7"}}, sessions.Handlers{OnStdout: func(d string) { out.WriteString(d) }})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("42"))
		Expect(out.String()).To(Equal("hello\n"))
		Eventually(func() sandboxv1alpha1.SessionPhase { return sessionNamed(ns, s.Name).Status.Phase }).
			WithTimeout(30 * time.Second).Should(Equal(sandboxv1alpha1.SessionClosed))
	})

	It("run once when the data-plane replica dies after the run started, and the caller gets its result", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1))
		replica := dataPlaneReplica()
		c := clientOn(ns, replica)
		type outcome struct {
			res *sessions.Result
			err error
		}
		done := make(chan outcome, 1)
		req := sessions.RunRequest{Pool: "py", Session: "dies-while-running", ExecRequest: sessions.ExecRequest{ID: "run-1",
			Code: "import time\nmarker = globals().get('marker', 0) + 1\nprint('started', flush=True)\ntime.sleep(4)\nmarker"}}
		started := make(chan struct{}, 1)
		go func() {
			defer GinkgoRecover()
			res, _, err := c.RunOnce(ctx, ns, req, sessions.Handlers{OnStdout: func(d string) {
				if d == "started\n" {
					started <- struct{}{}
				}
			}})
			done <- outcome{res, err}
		}()
		Eventually(started).WithTimeout(time.Minute).Should(Receive(), "the run starts on replica %s", replica.Name)
		kill(replica)
		var o outcome
		Eventually(done).WithTimeout(time.Minute).Should(Receive(&o))
		Expect(o.err).NotTo(HaveOccurred(), "the client asks another replica about the run and attaches to it")
		Expect(o.res.Status).To(Equal(sessions.StatusSucceeded), "%+v", o.res.Error)
		Expect(*o.res.Result).To(Equal("1"), "the code ran once")
	})

	It("do not run the code when the data-plane replica dies before the lease, and the caller is told so", func() {
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1).MaxPods(1))
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		holder, err := c.Create(ctx, ns, "holds-the-only-pod", "py", nil)
		Expect(err).NotTo(HaveOccurred())

		replica := dataPlaneReplica()
		done := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			_, _, err := clientOn(ns, replica).RunOnce(ctx, ns, sessions.RunRequest{Pool: "py", Session: "dies-waiting", Keep: true,
				ExecRequest: sessions.ExecRequest{Code: "marker = 'ran'"}}, sessions.Handlers{})
			done <- err
		}()
		// The run's Session waits for the pool's only pod.
		Eventually(func() string {
			ses := &sandboxv1alpha1.Session{}
			if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dies-waiting"}, ses) != nil {
				return ""
			}
			for _, cond := range ses.Status.Conditions {
				return cond.Reason
			}
			return ""
		}).WithTimeout(time.Minute).Should(Equal(sandboxv1alpha1.ReasonNoIdleSandbox))
		kill(replica)
		var runErr error
		Eventually(done).WithTimeout(time.Minute).Should(Receive(&runErr))
		var notRun *sessions.NotRunError
		Expect(errors.As(runErr, &notRun)).To(BeTrue(), "the caller is told the code did not run: %v", runErr)

		// The Session never held a pod, so the code cannot have run; the
		// client closed it, and it does not take the pod that comes free.
		Expect(holder.Close(ctx)).To(Succeed())
		Eventually(func() sandboxv1alpha1.SessionPhase { return sessionNamed(ns, "dies-waiting").Status.Phase }).
			WithTimeout(30 * time.Second).Should(Equal(sandboxv1alpha1.SessionClosed))
		Consistently(func() string { return sessionNamed(ns, "dies-waiting").Status.PodName }).
			WithTimeout(5 * time.Second).Should(BeEmpty())
	})
})

// sessionNamed reads a Session; an empty one when it cannot.
func sessionNamed(ns, name string) *sandboxv1alpha1.Session {
	ses := &sandboxv1alpha1.Session{}
	_ = k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ses)
	return ses
}
