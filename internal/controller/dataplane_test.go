package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// The data plane, exercised the way a user's program does: pkg/sessions with
// a user's client certificate, through kube-apiserver's aggregation layer to
// the manager's data-plane server and on to the Session's real agent.

// sessionUser grants user, in ns, what a Session user needs: Sessions in
// sandbox.warmpool.dev and the data-plane verbs in data.warmpool.dev.
func sessionUser(ns, user string, dataPlaneVerbs bool) *rest.Config {
	GinkgoHelper()
	rules := []rbacv1.PolicyRule{{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sessions"},
		Verbs: []string{"get", "list", "watch", "create", "delete"}}}
	if dataPlaneVerbs {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{sessions.Group},
			Resources: []string{"sessions/exec", "sessions/interrupt", "sessions/bridge", "sessions/executions",
				"sessions/variables", "sessions/files", "sessions/reset"},
			Verbs: []string{"create", "get", "update"}})
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}
	Expect(k8s.Create(ctx, role)).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}})).To(Succeed())
	// kube-apiserver's authorizer reads roles from its own cache: a request
	// sent at once may still be refused (403, seen in make test).
	last := rules[len(rules)-1]
	resource, sub, _ := strings.Cut(last.Resources[0], "/")
	Eventually(func() bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Group: last.APIGroups[0],
				Resource: resource, Subresource: sub, Verb: "create"}}}
		Expect(k8s.Create(ctx, sar)).To(Succeed())
		return sar.Status.Allowed
	}, 10*time.Second, 20*time.Millisecond).Should(BeTrue(), "the role of %s is in force", user)
	cfg, err := env.UserConfig(user)
	Expect(err).NotTo(HaveOccurred())
	return cfg
}

func sessionsClient(cfg *rest.Config) *sessions.Client {
	GinkgoHelper()
	c, err := sessions.New(cfg)
	Expect(err).NotTo(HaveOccurred())
	return c
}

var _ = Describe("Session data plane", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("runs 1,000 steps that share state, streams output in order, and reads variables and files", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		c := sessionsClient(sessionUser(ns, "alice", true))
		s, err := c.Create(ctx, ns, "loop", "python", &sessions.Options{Context: ptrTo(`{"n": 3}`), ContextJSON: true})
		Expect(err).NotTo(HaveOccurred())

		res, err := s.Run(ctx, sessions.ExecRequest{Code: "total = 0\ncontext['n']"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("3"))
		for i := 1; i <= 1000; i++ {
			res, err := s.Run(ctx, sessions.ExecRequest{Code: fmt.Sprintf("total += %d\ntotal", i)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(sessions.StatusSucceeded))
			Expect(*res.Result).To(Equal(fmt.Sprint(i * (i + 1) / 2)))
		}

		var lines []string
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "for i in range(50):\n    print(i, flush=True)"},
			sessions.Handlers{OnStdout: func(d string) { lines = append(lines, d) }})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded))
		want := ""
		for i := 0; i < 50; i++ {
			want += fmt.Sprintf("%d\n", i)
		}
		Expect(strings.Join(lines, "")).To(Equal(want), "streamed output, complete and in order")
		// An event longer than the relay's 64 KiB read buffer arrives whole (the
		// agent cuts a result at 64 Ki characters and says so after them).
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "'x' * 100000"}, sessions.Handlers{})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded))
		Expect(*res.Result).To(HavePrefix("'" + strings.Repeat("x", 65000)))
		Expect(len(*res.Result)).To(BeNumerically(">", 65536))

		v, err := s.Variable(ctx, "total")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(v.JSON)).To(Equal("500500"))
		_, err = s.Variable(ctx, "no_such_name")
		Expect(sessions.IsStatus(err, http.StatusNotFound)).To(BeTrue(), "%v", err)

		Expect(s.WriteFile(ctx, "data/in.txt", []byte("from the caller"))).To(Succeed())
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "open('data/in.txt').read().upper()"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("'FROM THE CALLER'"))
		got, err := s.ReadFile(ctx, "data/in.txt")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(got)).To(Equal("from the caller"))
		list, err := s.ListFiles(ctx, "data")
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(ContainElement(HaveField("Name", "in.txt")))
		_, err = s.ReadFile(ctx, "../../etc/passwd")
		Expect(sessions.IsStatus(err, http.StatusBadRequest)).To(BeTrue(), "a path outside the workspace: %v", err)

		// The runs were counted without an API write each; the Session says so at its bounded rate.
		Eventually(func() int64 { return getSession(ns, "loop").Status.Runs }, 40*time.Second).Should(BeNumerically(">=", 1000))

		Expect(s.Reset(ctx)).To(Succeed())
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "'total' in globals()"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("False"), "a reset gives a fresh interpreter")
		Expect(getSession(ns, "loop").Status.Phase).To(Equal(sandboxv1alpha1.SessionReady), "a reset does not lose the Session")

		pod := getSession(ns, "loop").Status.PodName
		Expect(s.Close(ctx)).To(Succeed())
		Eventually(sessionPodGone(ns, pod), 60*time.Second).Should(BeTrue())
	})

	It("streams llm_query calls to the caller and returns its answers to the code", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "agent", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		var prompts []string
		res, err := s.RunStream(ctx, sessions.ExecRequest{Code: "a = llm_query('2+2?')\nb = llm_query('3+3?')\nprint(a, b)\na + b"},
			sessions.Handlers{OnBridge: func(_ context.Context, call sessions.BridgeCall) (json.RawMessage, error) {
				var p struct{ Prompt string }
				Expect(json.Unmarshal(call.Params, &p)).To(Succeed())
				prompts = append(prompts, call.Method+":"+p.Prompt)
				return json.Marshal(map[string]string{"2+2?": "four", "3+3?": "six"}[p.Prompt])
			}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(prompts).To(Equal([]string{"llm_query:2+2?", "llm_query:3+3?"}))
		Expect(res.Stdout).To(Equal("four six\n"))
		Expect(*res.Result).To(Equal("'foursix'"))

		// An answer made after the run timed out reaches nobody; the result still comes.
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "print('asking', flush=True)\nllm_query('x')", TimeoutMillis: 500},
			sessions.Handlers{OnBridge: func(context.Context, sessions.BridgeCall) (json.RawMessage, error) {
				time.Sleep(1500 * time.Millisecond)
				return json.Marshal("too late")
			}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusTimedOut))
		Expect(res.Stdout).To(Equal("asking\n"))

		// An answer that is an error reaches the code as an exception.
		res, err = s.RunStream(ctx, sessions.ExecRequest{Code: "llm_query('x')"},
			sessions.Handlers{OnBridge: func(context.Context, sessions.BridgeCall) (json.RawMessage, error) {
				return nil, fmt.Errorf("model quota exhausted")
			}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusFailed))
		Expect(res.Error.Message).To(ContainSubstring("model quota exhausted"))
	})

	It("interrupts on request, at the timeout with partial output, and when a streaming caller goes away", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "slow", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		slow := "print('started', flush=True)\nimport time\ntime.sleep(60)"

		res, err := s.Run(ctx, sessions.ExecRequest{Code: slow, TimeoutMillis: 500})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusTimedOut))
		Expect(res.Stdout).To(Equal("started\n"), "partial output")
		Expect(res.Error.Type).To(Equal("KeyboardInterrupt"))

		started := make(chan struct{})
		var once sync.Once
		done := make(chan *sessions.Result, 1)
		go func() {
			defer GinkgoRecover()
			r, err := s.RunStream(ctx, sessions.ExecRequest{ID: "to-interrupt", Code: slow},
				sessions.Handlers{OnStdout: func(string) { once.Do(func() { close(started) }) }})
			Expect(err).NotTo(HaveOccurred())
			done <- r
		}()
		Eventually(started, 10*time.Second).Should(BeClosed())
		Expect(s.Interrupt(ctx, "to-interrupt")).To(Succeed())
		var r *sessions.Result
		Eventually(done, 10*time.Second).Should(Receive(&r))
		Expect(r.Status).To(Equal(sessions.StatusInterrupted))
		Expect(r.Stdout).To(Equal("started\n"))

		cctx, cancel := context.WithCancel(ctx)
		started2 := make(chan struct{})
		var once2 sync.Once
		go func() {
			defer GinkgoRecover()
			_, err := s.RunStream(cctx, sessions.ExecRequest{ID: "abandoned", Code: slow},
				sessions.Handlers{OnStdout: func(string) { once2.Do(func() { close(started2) }) }})
			Expect(err).To(HaveOccurred())
		}()
		Eventually(started2, 10*time.Second).Should(BeClosed())
		cancel()
		Eventually(func() protocol.Status {
			info, err := s.RunInfo(ctx, "abandoned")
			Expect(err).NotTo(HaveOccurred())
			if info.Result == nil {
				return "running"
			}
			return info.Result.Status
		}, 10*time.Second).Should(Equal(sessions.StatusInterrupted), "the run of a caller that went away is interrupted")
		// The interpreter survived all three: the Session goes on.
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "1 + 1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("2"))
	})

	It("refuses callers RBAC does not allow, and Sessions that are not Ready, saying why", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		alice := sessionsClient(sessionUser(ns, "alice", true))
		s, err := alice.Create(ctx, ns, "private", "python", nil)
		Expect(err).NotTo(HaveOccurred())

		// bob may read Sessions in ns but has no data-plane verb.
		bob := sessionsClient(sessionUser(ns, "bob", false)).Open(ns, "private")
		_, err = bob.Run(ctx, sessions.ExecRequest{Code: "1"})
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("sessions/exec"))
		_, err = bob.Variable(ctx, "x")
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "%v", err)

		// carol has every verb, in her own namespace only.
		other := newNamespace()
		carol := sessionsClient(sessionUser(other, "carol", true)).Open(ns, "private")
		_, err = carol.Run(ctx, sessions.ExecRequest{Code: "1"})
		Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "%v", err)

		_, err = alice.Open(ns, "no-such-session").Run(ctx, sessions.ExecRequest{Code: "1"})
		Expect(sessions.IsStatus(err, http.StatusNotFound)).To(BeTrue(), "%v", err)

		closeSession(ns, "private")
		sessionIn(ns, "private", sandboxv1alpha1.SessionClosed)
		// The data plane answers from its cache, which may be a moment behind
		// what this spec read from the API server.
		Eventually(func() error { _, err = s.Run(ctx, sessions.ExecRequest{Code: "1"}); return err }, 5*time.Second).Should(HaveOccurred())
		Expect(sessions.IsStatus(err, http.StatusConflict)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(And(ContainSubstring("Closed"), ContainSubstring("create a new Session")))
	})

	It("binds a Session to its owner on request: the data plane and Executions serve no one else", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		aliceCfg := sessionUser(ns, "alice", true)
		alice := sessionsClient(aliceCfg)
		s, err := alice.Create(ctx, ns, "mine", "python", &sessions.Options{OwnerOnly: true})
		Expect(err).NotTo(HaveOccurred())
		stored := getSession(ns, "mine")
		Expect(stored.Spec.Owner).To(Equal("alice"), "the client records who created the Session")
		Expect(stored.Spec.Access).To(Equal(sandboxv1alpha1.SessionAccessOwner))
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "secret = 'alice-only'\nopen('notes', 'w').write(secret)"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(protocol.StatusSucceeded), "%+v", res.Error)

		// bob has every data-plane verb in the namespace, and is refused each.
		bob := sessionsClient(sessionUser(ns, "bob", true)).Open(ns, "mine")
		refused := func(err error, what string) {
			GinkgoHelper()
			Expect(sessions.IsStatus(err, http.StatusForbidden)).To(BeTrue(), "%s: %v", what, err)
			Expect(err.Error()).To(And(ContainSubstring("serves its owner alone"), ContainSubstring(`"bob"`)), what)
		}
		_, err = bob.Run(ctx, sessions.ExecRequest{Code: "secret"})
		refused(err, "run")
		_, err = bob.Variable(ctx, "secret")
		refused(err, "variable")
		_, err = bob.ReadFile(ctx, "notes")
		refused(err, "file read")
		refused(bob.WriteFile(ctx, "notes", []byte("bob was here")), "file write")
		refused(bob.Interrupt(ctx, "any"), "interrupt")
		refused(bob.Reset(ctx), "reset")

		// Executions: bob's, and one that names no owner, fail; alice's runs
		// in the Session's interpreter.
		executionsAs := func(cfg *rest.Config, user string) client.Client {
			GinkgoHelper()
			Expect(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-executions"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"executions"},
					Verbs: []string{"create", "get"}}}})).To(Succeed())
			Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-executions"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user + "-executions"},
				Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}})).To(Succeed())
			c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
			Expect(err).NotTo(HaveOccurred())
			return c
		}
		bobCfg, err := env.UserConfig("bob")
		Expect(err).NotTo(HaveOccurred())
		bobExec := executionsAs(bobCfg, "bob")
		for _, ex := range []*sandboxv1alpha1.Execution{
			wrappers.Execution(ns, "bobs").Session("mine").Code("secret").Owner("bob").Obj(),
			wrappers.Execution(ns, "nobodys").Session("mine").Code("secret").Obj(),
		} {
			Expect(bobExec.Create(ctx, ex)).To(Succeed())
			got := finished(ex)
			Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed), ex.Name)
			Expect(condition(got.Status.Conditions, sandboxv1alpha1.ExecutionConditionComplete).Reason).
				To(Equal(sandboxv1alpha1.ReasonSessionOwnerOnly), ex.Name)
			Expect(got.Status.Stdout + got.Status.Result).NotTo(ContainSubstring("alice-only"))
		}
		alicesExec := wrappers.Execution(ns, "alices").Session("mine").Code("secret").Owner("alice").Obj()
		Expect(executionsAs(aliceCfg, "alice").Create(ctx, alicesExec)).To(Succeed())
		got := finished(alicesExec)
		Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", got.Status)
		Expect(got.Status.Result).To(Equal("'alice-only'"))

		// Nothing bob tried reached the interpreter: alice's file is hers.
		data, err := s.ReadFile(ctx, "notes")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(Equal("alice-only"))
	})

	It("keeps a Ready Session usable across a manager restart", func() {
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		s, err := sessionsClient(sessionUser(ns, "alice", true)).Create(ctx, ns, "durable", "python", nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = s.Run(ctx, sessions.ExecRequest{Code: "kept = 'yes'"})
		Expect(err).NotTo(HaveOccurred())
		restartManager()
		Eventually(func() error {
			res, err := s.Run(ctx, sessions.ExecRequest{Code: "kept"})
			if err == nil && (res.Result == nil || *res.Result != "'yes'") {
				return fmt.Errorf("result %+v", res)
			}
			return err
		}, 30*time.Second).Should(Succeed())
	})
})

func ptrTo[T any](v T) *T { return &v }
