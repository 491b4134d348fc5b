//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net/http"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// dataPlaneRestarts is how many times the data plane's containers restarted.
func dataPlaneRestarts() int32 {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace("warmpool-system"), client.MatchingLabels{"control-plane": "data-plane"})).To(Succeed())
	Expect(pods.Items).NotTo(BeEmpty())
	var n int32
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			n += cs.RestartCount
		}
	}
	return n
}

// The attack of issue 47 on the data plane's memory (256 MiB a replica): a
// tenant sends six forks of a Session holding 52 MB at once, three times.
var _ = Describe("Forks under the data plane's memory budget", Label("suspend"), func() {
	It("keep both data-plane replicas up under six forks of a 52 MB Session at once, three times: forks the budget cannot take are 429, none is left half-made, another tenant's runs are answered", func() {
		restarts := dataPlaneRestarts()
		ns, other := newNamespace(), newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(4))
		warmPool(wrappers.Pool(other, "py").Replicas(1))
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		src, err := c.Create(ctx, ns, "big", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		res, err := src.Run(ctx, sessions.ExecRequest{Code: "import os\nblob = os.urandom(52_000_000)\nlen(blob)"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		bystander, err := c.Create(ctx, other, "b", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = bystander.Close(context.Background()); _ = src.Close(context.Background()) })

		made := 0
		for range 3 {
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
			stop, ran := make(chan struct{}), make(chan int)
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
			Expect(<-ran).To(BeNumerically(">", 0))
			ok, refused := 0, 0
			for _, err := range errs {
				var e *sessions.Error
				switch {
				case err == nil:
					ok++
				case errors.As(err, &e) && e.Code == http.StatusTooManyRequests && e.RetryAfter > 0:
					refused++
				default:
					Fail("a fork failed otherwise: " + err.Error())
				}
			}
			Expect(ok).To(BeNumerically(">=", 1))
			Expect(refused).To(BeNumerically(">=", 1), "a replica's budget (half of 256 MiB, a namespace half of that) takes one 52 MB fork of a namespace at a time")
			made += ok
			var list sandboxv1alpha1.SessionList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			Expect(list.Items).To(HaveLen(1+made), "no half-made fork")
			for _, s := range list.Items {
				Expect(s.Annotations).NotTo(HaveKey(sandboxv1alpha1.AnnotationRestoring), "fork %s was never restored", s.Name)
			}
		}
		Expect(dataPlaneRestarts()).To(Equal(restarts), "no data-plane replica restarted (OOMKilled)")
	})
})
