//go:build e2e

package e2e

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/forkstorm"
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
		res, err := src.Run(ctx, sessions.ExecRequest{Code: forkstorm.BigState})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		bystander, err := c.Create(ctx, other, "b", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = bystander.Close(context.Background()); _ = src.Close(context.Background()) })

		made := 0
		for range 3 {
			out := forkstorm.Round(ctx, []*sessions.Session{src}, 6, bystander)
			Expect(out.Failed).To(BeEmpty(), "every fork is made or refused")
			Expect(out.BystanderErr).NotTo(HaveOccurred(), "another tenant's run during the forks")
			Expect(out.BystanderRuns).To(BeNumerically(">", 0))
			Expect(out.Made).To(BeNumerically(">=", 1))
			Expect(out.Refused).NotTo(BeEmpty(), "six 52 MB forks at once: a replica takes one fork of a Session at a time, and a namespace's share of its budget one such fork")
			made += out.Made
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
