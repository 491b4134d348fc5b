//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/fakellm"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// llm_query in Executions on the real cluster: the manager pod asks a
// ModelEndpoint served by this test process (an OpenAI-compatible fake on
// the host address the pods reach), with the key from a Secret of
// warmpool-system; the gVisor sandbox itself has no egress.
var _ = Describe("llm_query in Executions", func() {
	It("is answered by the pool's ModelEndpoint through the manager", func() {
		ns := newNamespace()
		model, err := fakellm.Start(net.JoinHostPort(hostAddressForPods(), "0"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(model.Close)

		name := "e2e-" + ns
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "warmpool-system", Name: name},
			StringData: map[string]string{"apiKey": "sk-e2e"}}
		Expect(k8s.Create(ctx, sec)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, sec) })
		me := &sandboxv1alpha1.ModelEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: sandboxv1alpha1.ModelEndpointSpec{URL: model.Endpoint(), Model: "tiny",
				APIKeySecretRef: &sandboxv1alpha1.SecretKeyReference{Name: name}}}
		Expect(k8s.Create(ctx, me)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, me) })
		Eventually(func(g Gomega) {
			got := &sandboxv1alpha1.ModelEndpoint{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(me), got)).To(Succeed())
			g.Expect(got.Status.Conditions).To(ContainElement(And(
				HaveField("Type", "Ready"), HaveField("Status", metav1.ConditionTrue))))
		}).WithTimeout(time.Minute).Should(Succeed())

		warmPool(wrappers.Pool(ns, "py").Replicas(1).LLM(name))
		host, port, _ := net.SplitHostPort(model.Listener.Addr().String())
		ex := execute(wrappers.Execution(ns, "ask").Pool("py").Code(fmt.Sprintf(
			"import socket\ntry:\n    socket.create_connection((%q, %s), timeout=2)\n    print('sandbox reached the model')\n"+
				"except OSError:\n    print('sandbox has no egress')\nllm_query('hello from gvisor')", host, port)).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status.Error)
		Expect(ex.Status.Result).To(Equal("'tiny says: hello from gvisor'"))
		Expect(ex.Status.Stdout).To(Equal("sandbox has no egress\n"), "the call went through the manager, not the sandbox")
		reqs := model.Requests()
		Expect(reqs).To(HaveLen(1))
		Expect(reqs[0].Authorization).To(Equal("Bearer sk-e2e"))

		By("a one-call run through the data plane, whose caller answers no calls itself (kubectl warmpool run)")
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		res, _, err := c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "py", ExecRequest: sessions.ExecRequest{Code: "llm_query('from a session')"}},
			sessions.Handlers{OnStdout: func(string) {}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("'tiny says: from a session'"), "the data plane asked the pool's ModelEndpoint")
		Expect(model.Requests()).To(HaveLen(2))
	})
})

// hostAddressForPods is this machine's address on the way to the pods (on
// the local cluster, the pod bridge's), where a server of the test can be
// reached by the manager pod.
func hostAddressForPods() string {
	GinkgoHelper()
	c, err := net.Dial("udp", net.JoinHostPort(managerPodIP(), "9"))
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = c.Close() }()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}
