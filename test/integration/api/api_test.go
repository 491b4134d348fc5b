package api_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// fromYAML turns a manifest, as a user would write it, into an object.
func fromYAML(ns, manifest string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	Expect(yaml.Unmarshal([]byte(manifest), &obj.Object)).To(Succeed())
	obj.SetNamespace(ns)
	return obj
}

// expectInvalid asserts that err is a validation error naming field with a
// message that contains msg: what `kubectl apply` shows the user.
func expectInvalid(err error, field, msg string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the API server accepted an object that should be rejected")
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got: %v", err)
	var status apierrors.APIStatus
	Expect(errors.As(err, &status)).To(BeTrue())
	causes := status.Status().Details.Causes
	var seen []string
	for _, c := range causes {
		if c.Field == field && strings.Contains(c.Message, msg) {
			return
		}
		seen = append(seen, c.Field+": "+c.Message)
	}
	Fail("no cause with field " + field + " and message containing " + msg + "; got:\n  " + strings.Join(seen, "\n  "))
}

const poolHeader = `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: SandboxPool
metadata:
  name: bad
spec:
`

const execHeader = `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: Execution
metadata:
  name: bad
spec:
`

var _ = Describe("Samples", func() {
	It("accepts every manifest in config/samples", func() {
		ns := newNamespace()
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		more, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "*", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		files = append(files, more...)
		created := 0
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
			for {
				doc, err := reader.Read()
				if errors.Is(err, io.EOF) {
					break
				}
				Expect(err).NotTo(HaveOccurred())
				if len(bytes.TrimSpace(doc)) == 0 {
					continue
				}
				obj := fromYAML(ns, string(doc))
				if obj.GetKind() == "ModelEndpoint" { // cluster-scoped
					obj.SetNamespace("")
				}
				Expect(k8s.Create(ctx, obj)).To(Succeed(), "sample %s (%s)", f, obj.GetName())
				created++
			}
		}
		Expect(created).To(BeNumerically(">=", 3), "the samples should hold a pool and Executions")
	})
})

var _ = Describe("Validation", func() {
	DescribeTable("rejects a bad manifest with a message that says what to fix",
		func(manifest, field, msg string) {
			ns := newNamespace()
			expectInvalid(k8s.Create(ctx, fromYAML(ns, manifest)), field, msg)
		},
		Entry("negative replicas", poolHeader+`
  image: repl
  replicas: -1`, "spec.replicas", "should be greater than or equal to 0"),
		Entry("maxPods below replicas", poolHeader+`
  image: repl
  replicas: 5
  maxPods: 2`, "spec", "spec.maxPods must be greater than or equal to spec.replicas"),
		Entry("missing image", poolHeader+`
  replicas: 1`, "spec.image", "Required value"),
		Entry("empty image", poolHeader+`
  image: ""`, "spec.image", "should be at least 1 chars long"),
		Entry("pool timeout of zero", poolHeader+`
  image: repl
  executionDefaults:
    timeout: 0s`, "spec.executionDefaults.timeout", "timeout must be greater than 0s and at most 24h"),
		Entry("pool default timeout above its ceiling", poolHeader+`
  image: repl
  executionDefaults:
    timeout: 2h`, "spec.executionDefaults", "executionDefaults.timeout must not exceed executionDefaults.maxTimeout"),
		Entry("pool timeout ceiling above a day", poolHeader+`
  image: repl
  executionDefaults:
    maxTimeout: 25h`, "spec.executionDefaults.maxTimeout", "maxTimeout must be greater than 0s and at most 24h"),
		Entry("pool output limit above the maximum", poolHeader+`
  image: repl
  executionDefaults:
    maxOutputBytes: 10485760`, "spec.executionDefaults.maxOutputBytes", "should be less than or equal to 131072"),
		Entry("preload that is not a module name", poolHeader+`
  image: repl
  python:
    preload: ["numpy; import os"]`, "spec.python.preload[0]", "should match"),
		Entry("runtime class that is not a name", poolHeader+`
  image: repl
  runtimeClassName: Not_A_Name`, "spec.runtimeClassName", "must be a RuntimeClass name"),
		Entry("unknown reuse policy", poolHeader+`
  image: repl
  reusePolicy: Always`, "spec.reusePolicy", `supported values: "Never", "FreshInterpreter"`),
		Entry("session idle timeout of zero", poolHeader+`
  image: repl
  sessionIdleTimeout: 0s`, "spec.sessionIdleTimeout", "must be between 1s and 24h"),
		Entry("a /tmp too small to hold anything", poolHeader+`
  image: repl
  limits:
    tmpSize: 512Ki`, "spec.limits.tmpSize", "tmpSize must be at least 1Mi"),
		Entry("a negative workspace size", poolHeader+`
  image: repl
  limits:
    workspaceSize: -1Gi`, "spec.limits.workspaceSize", "workspaceSize must be at least 1Mi"),
		Entry("a template label under the operator's prefix", poolHeader+`
  image: repl
  template:
    metadata:
      labels: {sandbox.warmpool.dev/state: idle}`, "spec.template.metadata.labels", "must not use keys under sandbox.warmpool.dev/: that prefix is reserved for the operator"),
		Entry("a template annotation under the operator's prefix", poolHeader+`
  image: repl
  template:
    metadata:
      annotations: {sandbox.warmpool.dev/claimed-by: x}`, "spec.template.metadata.annotations", "must not use keys under sandbox.warmpool.dev/: that prefix is reserved for the operator"),
		Entry("pool env read from a Secret", poolHeader+`
  image: repl
  env:
  - name: TOKEN
    valueFrom: {secretKeyRef: {name: creds, key: token}}`, "spec.env", "spec.env must not read Secrets or ConfigMaps"),
		Entry("pool env read from a ConfigMap", poolHeader+`
  image: repl
  env:
  - name: SETTINGS
    valueFrom: {configMapKeyRef: {name: settings, key: s}}`, "spec.env", "spec.env must not read Secrets or ConfigMaps"),
		Entry("pool env named like the operator's", poolHeader+`
  image: repl
  env:
  - {name: WARMPOOL_AGENT_KEY, value: x}`, "spec.env", "spec.env names starting with WARMPOOL_ are reserved for the operator"),
		Entry("egress to something that is not a CIDR", poolHeader+`
  image: repl
  network:
    egress: [{cidr: example.com}]`, "spec.network.egress[0].cidr", "cidr must be a CIDR such as 203.0.113.0/24"),
		Entry("egress to a bare address", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 203.0.113.7}]`, "spec.network.egress[0].cidr", "cidr must be a CIDR such as 203.0.113.0/24"),
		Entry("egress to a CIDR with host bits set", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 10.1.2.3/24}]`, "spec.network.egress[0].cidr", "cidr must be written with its network address (no host bits set)"),
		Entry("egress to the link-local range", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 169.254.0.0/16}]`, "spec.network.egress[0].cidr", "cidr must not be link-local"),
		Entry("egress to the cloud metadata address", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 169.254.169.254/32}]`, "spec.network.egress[0].cidr", "metadata services cannot be allowed"),
		Entry("egress to IPv6 link-local", poolHeader+`
  image: repl
  network:
    egress: [{cidr: "fe80::/64"}]`, "spec.network.egress[0].cidr", "cidr must not be link-local"),
		Entry("egress to Alibaba Cloud's metadata address", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 100.100.100.200/32}]`, "spec.network.egress[0].cidr", "metadata services cannot be allowed"),
		Entry("egress to AWS's IPv6 metadata address", poolHeader+`
  image: repl
  network:
    egress: [{cidr: "fd00:ec2::254/128"}]`, "spec.network.egress[0].cidr", "metadata services cannot be allowed"),
		Entry("egress to a port range that ends before it starts", poolHeader+`
  image: repl
  network:
    egress: [{cidr: 10.0.0.0/8, ports: [{port: 8080, endPort: 80}]}]`, "spec.network.egress[0].ports[0]", "endPort must be greater than or equal to port"),
		Entry("missing poolRef", execHeader+`
  code: print(1)`, "spec.poolRef", "Required value"),
		Entry("empty pool name", execHeader+`
  poolRef: {name: ""}
  code: print(1)`, "spec.poolRef.name", "should be at least 1 chars long"),
		Entry("empty code", execHeader+`
  poolRef: {name: python}
  code: ""`, "spec.code", "should be at least 1 chars long"),
		Entry("neither code nor codeFrom", execHeader+`
  poolRef: {name: python}`, "spec", "exactly one of spec.code or spec.codeFrom must be set"),
		Entry("both code and codeFrom", execHeader+`
  poolRef: {name: python}
  code: print(1)
  codeFrom:
    configMapKeyRef: {name: scripts, key: main.py}`, "spec", "exactly one of spec.code or spec.codeFrom must be set"),
		Entry("codeFrom naming both a ConfigMap and a Secret", execHeader+`
  poolRef: {name: python}
  codeFrom:
    configMapKeyRef: {name: scripts, key: main.py}
    secretKeyRef: {name: scripts, key: main.py}`, "spec.codeFrom", "needs exactly one of configMapKeyRef or secretKeyRef"),
		Entry("timeout of zero", execHeader+`
  poolRef: {name: python}
  code: print(1)
  timeout: 0s`, "spec.timeout", "spec.timeout must be greater than 0s and at most 24h"),
		Entry("timeout above the maximum", execHeader+`
  poolRef: {name: python}
  code: print(1)
  timeout: 25h`, "spec.timeout", "spec.timeout must be greater than 0s and at most 24h"),
		Entry("unknown language", execHeader+`
  poolRef: {name: python}
  code: puts 1
  language: ruby`, "spec.language", `supported values: "python", "shell"`),
		Entry("session name that is not a DNS label", execHeader+`
  poolRef: {name: python}
  code: print(1)
  session: My_Session`, "spec.session", "should match"),
		Entry("env name that is not a variable name", execHeader+`
  poolRef: {name: python}
  code: print(1)
  env:
  - {name: 1BAD, value: x}`, "spec.env[0].name", "should match"),
		Entry("unknown context format", execHeader+`
  poolRef: {name: python}
  code: print(context)
  context: "a,b"
  contextFormat: csv`, "spec.contextFormat", `supported values: "text", "json"`),
		Entry("negative ttlSecondsAfterFinished", execHeader+`
  poolRef: {name: python}
  code: print(1)
  ttlSecondsAfterFinished: -5`, "spec.ttlSecondsAfterFinished", "should be greater than or equal to 0"),
	)

	It("accepts egress to masked CIDRs, including ones that contain the link-local range (the operator cuts it out)", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, fromYAML(ns, poolHeader+`
  image: repl
  network:
    egress:
    - cidr: 0.0.0.0/0
      ports: [{port: 443}]
    - cidr: "::/0"
    - cidr: 10.20.0.0/16
      ports: [{port: 5432}, {protocol: UDP, port: 30000, endPort: 30100}]
    - cidr: 10.96.0.10/32
      ports: [{protocol: UDP, port: 53}]
  template:
    metadata:
      labels: {team: data, warmpool.dev/tier: gold}
`))).To(Succeed())
	})

	It("rejects a ModelEndpoint whose URL is not http(s) or whose limits are out of range", func() {
		endpoint := func(spec string) *unstructured.Unstructured {
			return fromYAML("", `
apiVersion: sandbox.warmpool.dev/v1alpha1
kind: ModelEndpoint
metadata:
  generateName: bad-
spec:
`+spec)
		}
		expectInvalid(k8s.Create(ctx, endpoint(`
  url: ftp://models.example.com/v1/chat/completions
  model: m`)), "spec.url", "url must be an http or https URL")
		expectInvalid(k8s.Create(ctx, endpoint(`
  url: not a url
  model: m`)), "spec.url", "url must be an http or https URL")
		expectInvalid(k8s.Create(ctx, endpoint(`
  url: https://models.example.com/v1/chat/completions
  model: m
  limits:
    callTimeout: 500ms`)), "spec.limits.callTimeout", "callTimeout must be between 1s and 10m")
		expectInvalid(k8s.Create(ctx, endpoint(`
  url: https://models.example.com/v1/chat/completions
  model: m
  limits:
    maxCallsPerRun: 0`)), "spec.limits.maxCallsPerRun", "should be greater than or equal to 1")
		expectInvalid(k8s.Create(ctx, endpoint(`
  url: https://models.example.com/v1/chat/completions
  model: ""`)), "spec.model", "at least 1 chars long")
		// The defaults a platform team gets when it sets no limits.
		ok := endpoint(`
  url: https://models.example.com/v1/chat/completions
  model: m`)
		Expect(k8s.Create(ctx, ok)).To(Succeed())
		limits, _, _ := unstructured.NestedMap(ok.Object, "spec", "limits")
		Expect(limits).To(Equal(map[string]any{"maxCallsPerRun": int64(20), "maxPromptBytes": int64(65536),
			"maxTokens": int64(1024), "callTimeout": "60s"}))
	})

	It("rejects code larger than the limit that keeps an Execution well below etcd's object size", func() {
		ns := newNamespace()
		big := strings.Repeat("x", sandboxv1alpha1.MaxCodeBytes+1)
		err := k8s.Create(ctx, wrappers.Execution(ns, "big").Code(big).Obj())
		expectInvalid(err, "spec.code", "Too long")
	})

	It("rejects a Session whose name could not label its pod, and a change of its pool", func() {
		ns := newNamespace()
		err := k8s.Create(ctx, wrappers.Session(ns, strings.Repeat("s", 64)).Obj())
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("at most 63 characters"))
		ses := wrappers.Session(ns, "ok").Obj()
		Expect(k8s.Create(ctx, ses)).To(Succeed())
		ses.Spec.PoolRef.Name = "other"
		expectInvalid(k8s.Update(ctx, ses), "spec.poolRef", "spec.poolRef is immutable")
	})

	DescribeTable("keeps an Execution's spec immutable after creation",
		func(mutate func(*sandboxv1alpha1.Execution), field, msg string) {
			ns := newNamespace()
			ex := wrappers.Execution(ns, "ex").Session("s1").Timeout(10*time.Second).Env("A", "1").JSONContext(`{"k":1}`).Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			mutate(ex)
			expectInvalid(k8s.Update(ctx, ex), field, msg)
		},
		Entry("changing code", func(ex *sandboxv1alpha1.Execution) { ex.Spec.Code = ptr.To("print(2)") },
			"spec.code", "spec.code is immutable"),
		Entry("changing the pool", func(ex *sandboxv1alpha1.Execution) { ex.Spec.PoolRef.Name = "other" },
			"spec.poolRef", "spec.poolRef is immutable"),
		Entry("changing the timeout", func(ex *sandboxv1alpha1.Execution) {
			ex.Spec.Timeout = &metav1.Duration{Duration: time.Minute}
		}, "spec.timeout", "spec.timeout is immutable"),
		Entry("changing the session", func(ex *sandboxv1alpha1.Execution) { ex.Spec.Session = "s2" },
			"spec.session", "spec.session is immutable"),
		Entry("removing the session", func(ex *sandboxv1alpha1.Execution) { ex.Spec.Session = "" },
			"spec", "spec is immutable except cancel and ttlSecondsAfterFinished"),
		Entry("changing env", func(ex *sandboxv1alpha1.Execution) { ex.Spec.Env[0].Value = "2" },
			"spec.env", "spec.env is immutable"),
		Entry("changing context", func(ex *sandboxv1alpha1.Execution) {
			ex.Spec.Context = ptr.To(`{"k":2}`)
		}, "spec.context", "spec.context is immutable"),
		Entry("switching code to codeFrom", func(ex *sandboxv1alpha1.Execution) {
			ex.Spec.Code = nil
			ex.Spec.CodeFrom = &sandboxv1alpha1.CodeSource{ConfigMapKeyRef: &sandboxv1alpha1.KeyReference{Name: "c", Key: "k"}}
		}, "spec", "spec is immutable except cancel and ttlSecondsAfterFinished"),
		Entry("changing the language", func(ex *sandboxv1alpha1.Execution) { ex.Spec.Language = sandboxv1alpha1.LanguageShell },
			"spec.language", "spec.language is immutable"),
	)

	It("lets a user cancel an Execution and change its TTL after creation", func() {
		ns := newNamespace()
		ex := wrappers.Execution(ns, "ex").Session("s1").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		ex.Spec.Cancel = true
		ex.Spec.TTLSecondsAfterFinished = ptr.To[int32](60)
		Expect(k8s.Update(ctx, ex)).To(Succeed())
		got := &sandboxv1alpha1.Execution{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
		Expect(got.Spec.Cancel).To(BeTrue())
		Expect(got.Spec.TTLSecondsAfterFinished).To(HaveValue(BeEquivalentTo(60)))
	})
})

var _ = Describe("Defaults", func() {
	It("fills a minimal SandboxPool with safe defaults", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, fromYAML(ns, poolHeader+"  image: repl\n"))).To(Succeed())
		pool := &sandboxv1alpha1.SandboxPool{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad"}, pool)).To(Succeed())
		s := pool.Spec
		Expect(s.Replicas).To(BeEquivalentTo(1))
		Expect(s.MaxPods).To(BeNil())
		Expect(s.RuntimeClassName).To(HaveValue(Equal("gvisor")))
		Expect(s.ReusePolicy).To(Equal(sandboxv1alpha1.ReuseNever))
		Expect(s.ImagePullPolicy).To(Equal(corev1.PullIfNotPresent))
		Expect(s.ExecutionDefaults.Timeout).To(HaveValue(Equal(metav1.Duration{Duration: 30 * time.Second})))
		Expect(s.ExecutionDefaults.InterruptGracePeriod).To(HaveValue(Equal(metav1.Duration{Duration: 5 * time.Second})))
		Expect(s.ExecutionDefaults.MaxOutputBytes).To(BeEquivalentTo(sandboxv1alpha1.DefaultMaxOutputBytes))
		Expect(s.SessionIdleTimeout).To(HaveValue(Equal(metav1.Duration{Duration: 10 * time.Minute})))
		Expect(s.Resources.Limits).To(HaveKeyWithValue(corev1.ResourceCPU, resource.MustParse("1")))
		Expect(s.Resources.Limits).To(HaveKeyWithValue(corev1.ResourceMemory, resource.MustParse("512Mi")))
		Expect(s.Autoscaling).To(BeNil(), "autoscaling is off unless asked for")
	})

	It("fills autoscaling with its defaults and rejects a target outside (0, 1)", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, fromYAML(ns, poolHeader+"  image: repl\n  autoscaling:\n    maxReplicas: 10\n"))).To(Succeed())
		pool := &sandboxv1alpha1.SandboxPool{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad"}, pool)).To(Succeed())
		Expect(pool.Spec.Autoscaling).To(HaveValue(Equal(sandboxv1alpha1.PoolAutoscaling{MinReplicas: 1, MaxReplicas: 10,
			TargetWarmRatio: "0.99", ScaleDownDelay: &metav1.Duration{Duration: 2 * time.Minute}})))
		for _, bad := range []string{"1", "1.0", "0", "0.0", "99%", "-0.5", ".99999"} {
			expectInvalid(k8s.Create(ctx, fromYAML(ns, poolHeader+"  image: repl\n  autoscaling:\n    maxReplicas: 10\n    targetWarmRatio: \""+bad+"\"\n")),
				"spec.autoscaling.targetWarmRatio", "targetWarmRatio must be a decimal between 0 and 1")
		}
		expectInvalid(k8s.Create(ctx, fromYAML(ns, poolHeader+"  image: repl\n  autoscaling:\n    minReplicas: 3\n    maxReplicas: 2\n")),
			"spec.autoscaling", "autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
	})

	It("keeps an explicit empty runtimeClassName, the opt-out of gVisor", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, wrappers.Pool(ns, "trusted").RuntimeClass("").Obj())).To(Succeed())
		pool := &sandboxv1alpha1.SandboxPool{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "trusted"}, pool)).To(Succeed())
		Expect(pool.Spec.RuntimeClassName).To(HaveValue(Equal("")))
	})

	It("fills a minimal Execution's language and leaves the timeout to the pool", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, fromYAML(ns, execHeader+"  poolRef: {name: python}\n  code: print(1)\n"))).To(Succeed())
		ex := &sandboxv1alpha1.Execution{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad"}, ex)).To(Succeed())
		Expect(ex.Spec.Language).To(Equal(sandboxv1alpha1.LanguagePython))
		Expect(ex.Spec.Timeout).To(BeNil(), "an unset timeout means the pool's executionDefaults.timeout")
		Expect(ex.Spec.ContextFormat).To(Equal(sandboxv1alpha1.ContextText))
		Expect(ex.Spec.Cancel).To(BeFalse())
	})
})

var _ = Describe("Subresources", func() {
	It("serves /scale on a SandboxPool as kubectl scale uses it", func() {
		ns := newNamespace()
		pool := wrappers.Pool(ns, "python").Replicas(2).Obj()
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		pool.Status.Replicas = 2
		pool.Status.Selector = "sandbox.warmpool.dev/pool=python"
		Expect(k8s.Status().Update(ctx, pool)).To(Succeed())

		scale := &autoscalingv1.Scale{}
		Expect(k8s.SubResource("scale").Get(ctx, pool, scale)).To(Succeed())
		Expect(scale.Spec.Replicas).To(BeEquivalentTo(2))
		Expect(scale.Status.Replicas).To(BeEquivalentTo(2))
		Expect(scale.Status.Selector).To(Equal("sandbox.warmpool.dev/pool=python"))

		scale.Spec.Replicas = 7
		Expect(k8s.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))).To(Succeed())
		got := &sandboxv1alpha1.SandboxPool{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), got)).To(Succeed())
		Expect(got.Spec.Replicas).To(BeEquivalentTo(7))

		scale.Spec.Replicas = -1
		Expect(k8s.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))).NotTo(Succeed(),
			"a negative scale must be rejected like a negative spec.replicas")
	})

	It("writes status only through /status", func() {
		ns := newNamespace()
		ex := wrappers.Execution(ns, "ex").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())

		ex.Status.Phase = sandboxv1alpha1.PhaseSucceeded
		ex.Status.Stdout = "forged"
		Expect(k8s.Update(ctx, ex)).To(Succeed())
		got := &sandboxv1alpha1.Execution{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
		Expect(got.Status.Phase).To(BeEmpty(), "an update of the main resource must not change status")
		Expect(got.Status.Stdout).To(BeEmpty())

		got.Status.Phase = sandboxv1alpha1.PhaseRunning
		got.Spec.Cancel = true
		Expect(k8s.Status().Update(ctx, got)).To(Succeed())
		after := &sandboxv1alpha1.Execution{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), after)).To(Succeed())
		Expect(after.Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning))
		Expect(after.Spec.Cancel).To(BeFalse(), "an update of /status must not change spec")
	})

	It("rejects an unknown phase in status", func() {
		ns := newNamespace()
		ex := wrappers.Execution(ns, "ex").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		ex.Status.Phase = "Exploded"
		expectInvalid(k8s.Status().Update(ctx, ex), "status.phase", "Unsupported value")
	})
})
