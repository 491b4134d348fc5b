package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/fakellm"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// llm_query in Executions (issue 13): the manager asks the pool's
// ModelEndpoint, an OpenAI-compatible server the test runs on loopback that
// answers deterministically.
var _ = Describe("llm_query in Executions", func() {
	var (
		ns    string
		model *fakellm.Server
	)
	BeforeEach(func() {
		ns = newNamespace()
		var err error
		model, err = fakellm.Start("")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(model.Close)
	})
	keysSeen := func() []string {
		var keys []string
		for _, r := range model.Requests() {
			keys = append(keys, r.Authorization)
		}
		return keys
	}

	endpoint := func(name string, selector map[string]string, maxCalls int32) *sandboxv1alpha1.ModelEndpoint {
		me := &sandboxv1alpha1.ModelEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: sandboxv1alpha1.ModelEndpointSpec{URL: model.Endpoint(), Model: "tiny",
				APIKeySecretRef: &sandboxv1alpha1.SecretKeyReference{Name: name + "-key"},
				Limits:          sandboxv1alpha1.ModelLimits{MaxCallsPerRun: maxCalls}}}
		if selector != nil {
			me.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: selector}
		}
		Expect(k8s.Create(ctx, me)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, me))).To(Succeed()) })
		return me
	}
	key := func(name, value string) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: name + "-key"},
			Data: map[string][]byte{"apiKey": []byte(value)}}
		Expect(k8s.Create(ctx, sec)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, sec))).To(Succeed()) })
	}
	ready := func(name string) *metav1.Condition {
		me := &sandboxv1alpha1.ModelEndpoint{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, me)).To(Succeed())
		return meta.FindStatusCondition(me.Status.Conditions, "Ready")
	}

	It("answers the code's llm_query with the pool's endpoint and key, and holds a run to its call limit", func() {
		name := "llm-" + ns
		key(name, "sk-test-1")
		endpoint(name, nil, 2)
		Eventually(func() string {
			if c := ready(name); c != nil {
				return string(c.Status) + "/" + c.Reason
			}
			return ""
		}).Should(Equal("True/KeyFound"))
		createPoolAndWait(wrappers.Pool(ns, "python").LLM(name).Obj())

		ex := run(wrappers.Execution(ns, "ask").Code("a = llm_query('hello')\nprint(a)\nrlm_query('sum', [1, 2])").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status.Error)
		Expect(ex.Status.Stdout).To(Equal("tiny says: hello\n"))
		Expect(ex.Status.Result).To(Equal("'tiny says: sum\\n\\nContext:\\n[1,2]'"))
		Expect(keysSeen()).To(Equal([]string{"Bearer sk-test-1", "Bearer sk-test-1"}), "the manager sends the key; the sandbox never sees it")

		ex = run(wrappers.Execution(ns, "greedy").Code("for i in range(3):\n    print(llm_query(str(i)))").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(ex.Status.Error.Type).To(Equal("RuntimeError"))
		Expect(ex.Status.Error.Message).To(ContainSubstring("limit of 2"))
		Expect(ex.Status.Stdout).To(Equal("tiny says: 0\ntiny says: 1\n"), "the calls within the limit were answered")
	})

	It("tells the code why it cannot ask: a namespace the endpoint does not admit, a missing key, a missing endpoint", func() {
		name := "llm-" + ns
		endpoint(name, map[string]string{"warmpool.dev/llm": "allowed"}, 5)
		Eventually(func() string {
			if c := ready(name); c != nil {
				return string(c.Status) + "/" + c.Reason + "/" + c.Message
			}
			return ""
		}).Should(And(HavePrefix("False/KeyUnavailable/"), ContainSubstring("does not exist")))
		createPoolAndWait(wrappers.Pool(ns, "python").LLM(name).Obj())
		ex := run(wrappers.Execution(ns, "other-ns").Code("llm_query('x')").Obj())
		Expect(ex.Status.Error.Type).To(Equal("RuntimeError"))
		Expect(ex.Status.Error.Message).To(ContainSubstring("does not admit namespace " + ns))

		nsObj := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, nsObj)).To(Succeed())
		nsObj.Labels["warmpool.dev/llm"] = "allowed"
		Expect(k8s.Update(ctx, nsObj)).To(Succeed())
		ex = run(wrappers.Execution(ns, "no-key").Code("llm_query('x')").Obj())
		Expect(ex.Status.Error.Message).To(ContainSubstring("Secret " + managerNamespace + "/" + name + "-key does not exist"))

		key(name, "sk-2")
		ex = run(wrappers.Execution(ns, "admitted").Code("llm_query('x')").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status.Error)
		Expect(ex.Status.Result).To(Equal("'tiny says: x'"))

		createPoolAndWait(wrappers.Pool(ns, "nomodel").LLM("no-such-endpoint").Obj())
		ex = run(wrappers.Execution(ns, "missing").Pool("nomodel").Code("llm_query('x')").Obj())
		Expect(ex.Status.Error.Message).To(ContainSubstring(`ModelEndpoint "no-such-endpoint" does not exist`))
		Expect(keysSeen()).To(Equal([]string{"Bearer sk-2"}), "only the admitted call reached the model")
	})
})
