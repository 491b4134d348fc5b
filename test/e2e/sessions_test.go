//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// Sessions on the real cluster: the manager's data plane behind the
// APIService that `make deploy` installs, reached through kube-apiserver's
// aggregator with the suite's kubeconfig, running code in gVisor pods.
var _ = Describe("Sessions through the aggregated data plane", Ordered, func() {
	var ns string
	var c *sessions.Client

	BeforeAll(func() {
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(1).Timeout(30 * time.Second).GracePeriod(2 * time.Second))
		Eventually(func(g Gomega) {
			as := &unstructured.Unstructured{}
			as.SetAPIVersion("apiregistration.k8s.io/v1")
			as.SetKind("APIService")
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: "v1alpha1.data.warmpool.dev"}, as)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
			g.Expect(conds).To(ContainElement(And(HaveKeyWithValue("type", "Available"), HaveKeyWithValue("status", "True"))), "%v", conds)
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		var err error
		c, err = sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
	})

	It("runs steps that share state, streams output, answers llm_query, and handles files, timeouts and reset", func() {
		s, err := c.Create(ctx, ns, "e2e-", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })

		for i := 1; i <= 100; i++ {
			res, err := s.Run(ctx, sessions.ExecRequest{Code: fmt.Sprintf("n = globals().get('n', 0) + %d\nn", i)})
			Expect(err).NotTo(HaveOccurred())
			Expect(*res.Result).To(Equal(fmt.Sprint(i * (i + 1) / 2)))
		}
		var out strings.Builder
		res, err := s.RunStream(ctx, sessions.ExecRequest{Code: "for i in range(5):\n    print(i)\nans = llm_query('ping')\nans"},
			sessions.Handlers{
				OnStdout: func(d string) { out.WriteString(d) },
				OnBridge: func(_ context.Context, call sessions.BridgeCall) (json.RawMessage, error) {
					return json.Marshal("pong from " + call.Method)
				},
			})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(out.String()).To(Equal("0\n1\n2\n3\n4\n"))
		Expect(*res.Result).To(Equal("'pong from llm_query'"))

		Expect(s.WriteFile(ctx, "in.txt", []byte("gvisor"))).To(Succeed())
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "open('in.txt').read()"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("'gvisor'"))
		v, err := s.Variable(ctx, "n")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(v.JSON)).To(Equal("5050"))

		res, err = s.Run(ctx, sessions.ExecRequest{Code: "print('before', flush=True)\nimport time\ntime.sleep(60)", TimeoutMillis: 1000})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusTimedOut))
		Expect(res.Stdout).To(Equal("before\n"))

		Expect(s.Reset(ctx)).To(Succeed())
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "'n' in globals()"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("False"))
		obj, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(obj.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
	})

	It("refuses a user without the data-plane verbs with 403", func() {
		s, err := c.Create(ctx, ns, "guarded-", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })
		cfg := rest.CopyConfig(restConfig)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "e2e-nobody"}
		nobody, err := sessions.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		_, err = nobody.Open(ns, s.Name).Run(ctx, sessions.ExecRequest{Code: "1"})
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "%v", err)
	})
})
