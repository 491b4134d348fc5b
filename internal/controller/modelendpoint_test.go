package controller_test

import (
	"context"
	"encoding/json"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/fakellm"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
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

	It("answers llm_query in a Session's runs too, unless the caller answers them itself", func() {
		name := "llm-" + ns
		key(name, "sk-ses")
		endpoint(name, nil, 3)
		createPoolAndWait(wrappers.Pool(ns, "python").Replicas(2).LLM(name).Obj())
		c := sessionsClient(sessionUser(ns, "alice", true))
		grantRuns(ns, "alice")
		s, err := c.Create(ctx, ns, "ask", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })

		By("a blocking run: the data plane reads the agent's events and answers the calls")
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "a = llm_query('one')\nprint(a)\nllm_query('two')"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(res.Stdout).To(Equal("tiny says: one\n"))
		Expect(*res.Result).To(Equal("'tiny says: two'"))

		By("a streamed run: output relayed as written, the calls answered aside, the endpoint's call limit held")
		var out strings.Builder
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "for i in range(5):\n    print(llm_query(str(i)), flush=True)"},
			sessions.Handlers{OnStdout: func(d string) { out.WriteString(d) }})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusFailed))
		Expect(res.Error.Message).To(ContainSubstring("limit of 3"))
		Expect(out.String()).To(Equal("tiny says: 0\ntiny says: 1\ntiny says: 2\n"))

		By("a caller that answers the calls itself gets them, and the model is not asked")
		before := len(keysSeen())
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "llm_query('mine')"}, sessions.Handlers{
			OnBridge: func(_ context.Context, call sessions.BridgeCall) (json.RawMessage, error) {
				return json.Marshal("the caller's answer")
			}})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal(`"the caller's answer"`))
		Expect(keysSeen()).To(HaveLen(before))

		By("a one-call run (the plugin's and the SDKs' one-shot path)")
		res, _, err = c.RunOnce(ctx, ns, sessions.RunRequest{Pool: "python", ExecRequest: sessions.ExecRequest{Code: "llm_query('once')"}},
			sessions.Handlers{OnStdout: func(string) {}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("'tiny says: once'"))
		for _, k := range keysSeen() {
			Expect(k).To(Equal("Bearer sk-ses"))
		}
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
