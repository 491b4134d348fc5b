//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// probeScript tries each target of its context (or argv[1]) at once and prints
// one JSON object: for each target how the attempt ended: "connected",
// "answered" (DNS), "http" (with the status code), "refused" or "timeout".
// An enforcer that REJECTs (kube-router) shows up as "refused", one that DROPs
// (or REJECTs past the kernel's ICMP rate limit) as "timeout".
const probeScript = `
import json, socket, struct, sys, threading, urllib.error, urllib.request
try:
    targets = context
except NameError:
    targets = json.loads(sys.argv[1])
T = 3

def tcp(t):
    s = socket.socket(socket.AF_INET6 if ':' in t['host'] else socket.AF_INET)
    s.settimeout(T)
    try:
        s.connect((t['host'], t['port']))
        s.settimeout(1)
        try:
            banner = s.recv(64).decode(errors='replace').strip()
        except OSError:
            banner = ''
        return {'result': 'connected', 'detail': banner}
    except socket.timeout:
        return {'result': 'timeout'}
    except ConnectionRefusedError:
        return {'result': 'refused'}
    except OSError as e:
        return {'result': 'error', 'detail': str(e)}
    finally:
        s.close()

def http(t):
    req = urllib.request.Request(t['url'], data=b'{"code": "print(1)"}', method='POST',
                                 headers={'Authorization': 'Bearer ' + t.get('token', ''), 'Content-Type': 'application/json'})
    try:
        r = urllib.request.urlopen(req, timeout=T)
        return {'result': 'http', 'detail': str(r.status)}
    except urllib.error.HTTPError as e:
        return {'result': 'http', 'detail': str(e.code)}
    except urllib.error.URLError as e:
        r = e.reason
        if isinstance(r, socket.timeout) or 'timed out' in str(r):
            return {'result': 'timeout'}
        if isinstance(r, ConnectionRefusedError):
            return {'result': 'refused'}
        return {'result': 'error', 'detail': str(r)}
    except socket.timeout:
        return {'result': 'timeout'}

def dns(t):
    server = t.get('host')
    if not server:
        server = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
    q = struct.pack('>HHHHHH', 0x5741, 0x0100, 1, 0, 0, 0)
    q += b''.join(bytes([len(p)]) + p.encode() for p in t['name'].split('.')) + b'\0' + struct.pack('>HH', 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(T)
    try:
        s.sendto(q, (server, 53))
        data, _ = s.recvfrom(1024)
        answers = struct.unpack('>H', data[6:8])[0]
        if answers == 0:
            return {'result': 'answered', 'detail': 'no answer, server ' + server}
        return {'result': 'answered', 'detail': socket.inet_ntoa(data[-4:])}
    except socket.timeout:
        return {'result': 'timeout', 'detail': 'server ' + server}
    except ConnectionRefusedError:
        return {'result': 'refused', 'detail': 'server ' + server}
    except OSError as e:
        return {'result': 'error', 'detail': str(e)}
    finally:
        s.close()

out = {}
def one(name, t):
    out[name] = {'tcp': tcp, 'http': http, 'dns': dns}[t['kind']](t)
threads = [threading.Thread(target=one, args=(n, t)) for n, t in targets.items()]
for th in threads: th.start()
for th in threads: th.join()
print(json.dumps(out, sort_keys=True))
`

type target struct {
	Kind  string `json:"kind"`
	Host  string `json:"host,omitempty"`
	Port  int    `json:"port,omitempty"`
	URL   string `json:"url,omitempty"`
	Token string `json:"token,omitempty"`
	Name  string `json:"name,omitempty"`
}

type outcome struct {
	Result string `json:"result"`
	Detail string `json:"detail"`
}

func (o outcome) String() string { return o.Result + " " + o.Detail }

// beBlocked matches an attempt that a policy stopped before any byte of the
// far end was seen. It is only meaningful next to a control that connected to
// the same target, which shows "refused" did not come from an empty port.
func beBlocked() OmegaMatcher {
	return HaveField("Result", BeElementOf("refused", "timeout"))
}

func parseOutcomes(out string) map[string]outcome {
	GinkgoHelper()
	res := map[string]outcome{}
	Expect(json.Unmarshal([]byte(strings.TrimSpace(out)), &res)).To(Succeed(), "probe output: %s", out)
	GinkgoWriter.Printf("probe outcomes: %s\n", strings.TrimSpace(out))
	return res
}

// probeFromSandbox runs the probe as an Execution's code in the pool; it
// returns the outcomes and the pod the code ran in.
func probeFromSandbox(ns, pool, name string, targets map[string]target) (map[string]outcome, string) {
	GinkgoHelper()
	return probeAs(wrappers.Execution(ns, name).Pool(pool), targets)
}

// probeAs runs the probe as the code of the Execution w builds.
func probeAs(w *wrappers.ExecutionWrapper, targets map[string]target) (map[string]outcome, string) {
	GinkgoHelper()
	ctxJSON, err := json.Marshal(targets)
	Expect(err).NotTo(HaveOccurred())
	ex := execute(w.Timeout(time.Minute).JSONContext(string(ctxJSON)).Code(probeScript).Obj())
	Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
	return parseOutcomes(ex.Status.Stdout), ex.Status.PodName
}

// agentToken signs a token for pod p's agent with the manager's keys.
func agentToken(p corev1.Pod) string {
	GinkgoHelper()
	secret := &corev1.Secret{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: "warmpool-agent-keys"}, secret)).To(Succeed())
	keys, err := agentauth.ParseKeyring(secret.Data)
	Expect(err).NotTo(HaveOccurred())
	tok, err := keys.Token(string(p.UID), p.Labels[sandboxpod.LabelAgentKey])
	Expect(err).NotTo(HaveOccurred())
	return tok
}

// agentStatus calls pod p's agent from this machine (the node, which the
// pools' policies admit for the kubelet's probes) and returns the HTTP status.
func agentStatus(p corev1.Pod, token string) int {
	GinkgoHelper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s:%d/v1/variables/x", p.Status.PodIP, sandboxpod.AgentPort), nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	return resp.StatusCode
}

// probeFromPod runs the probe in an ordinary pod that no policy selects: the
// control that shows each target is really there.
func probeFromPod(ns, pod string, targets map[string]target) map[string]outcome {
	GinkgoHelper()
	ctxJSON, err := json.Marshal(targets)
	Expect(err).NotTo(HaveOccurred())
	return parseOutcomes(run(kubectl(), "-n", ns, "exec", pod, "--", "python3", "-c", probeScript, string(ctxJSON)))
}

// hostListener serves a banner on addr until the spec ends; it returns the port.
func hostListener(addr string) int {
	GinkgoHelper()
	ln, err := net.Listen("tcp", addr)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(ln.Close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("warmpool-e2e " + addr + "\n"))
			_ = c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// metadataAddress puts 169.254.169.254, where clouds serve instance
// credentials, on this machine's loopback for the spec's length (the kernel
// here has no dummy interfaces), unless it is there already.
func metadataAddress() string {
	GinkgoHelper()
	const addr = "169.254.169.254"
	if err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").Run(); err == nil {
		DeferCleanup(func() { _ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	}
	out := run("ip", "-o", "addr", "show", "dev", "lo")
	Expect(out).To(ContainSubstring(addr+"/32"), "the metadata address is on loopback")
	return addr
}

// nodeAddress is the node's InternalIP: an address of the node outside the pod network.
func nodeAddress() string {
	GinkgoHelper()
	nodes := &corev1.NodeList{}
	Expect(k8s.List(ctx, nodes)).To(Succeed())
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP && net.ParseIP(a.Address).To4() != nil {
			return a.Address
		}
	}
	Fail("the node has no IPv4 InternalIP")
	return ""
}

// apiServerAddress is the API server's own address (the kubernetes Service's endpoint).
func apiServerAddress() (string, int) {
	GinkgoHelper()
	slices := &discoveryv1.EndpointSliceList{}
	Expect(k8s.List(ctx, slices, client.InNamespace("default"), client.MatchingLabels{"kubernetes.io/service-name": "kubernetes"})).To(Succeed())
	Expect(slices.Items).NotTo(BeEmpty())
	s := slices.Items[0]
	return s.Endpoints[0].Addresses[0], int(*s.Ports[0].Port)
}

func managerPodIP() string {
	GinkgoHelper()
	pods := &corev1.PodList{}
	Expect(k8s.List(ctx, pods, client.InNamespace("warmpool-system"), client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p.Status.PodIP
		}
	}
	Fail("no running manager pod")
	return ""
}

// bindRole binds user to the ClusterRole role in namespace.
func bindRole(namespace, user, role string) {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	})).To(Succeed())
}

// can is `kubectl auth can-i` as user: "yes" or "no".
func can(user, verb, resource, namespace string, extra ...string) string {
	out, _ := kubectlOut(append([]string{"auth", "can-i", verb, resource, "-n", namespace, "--as", user}, extra...)...)
	return strings.TrimSpace(out)
}

// idlePod returns a Ready, unclaimed pod of the pool.
func idlePod(pool *sandboxv1alpha1.SandboxPool) corev1.Pod {
	GinkgoHelper()
	var found corev1.Pod
	Eventually(func(g Gomega) {
		for _, p := range poolPods(g, pool) {
			if sandboxpod.IsIdle(&p) {
				found = p
				return
			}
		}
		g.Expect(false).To(BeTrue(), "no idle pod in pool %s", pool.Name)
	}).WithTimeout(2 * time.Minute).Should(Succeed())
	return found
}

func agentURL(p corev1.Pod) string {
	return fmt.Sprintf("http://%s:%d%s", p.Status.PodIP, sandboxpod.AgentPort, "/v1/execute")
}

// startControlPod runs an ordinary pod with the sandbox image's python3, in a
// namespace of its own without any NetworkPolicy, as restricted as a sandbox.
func startControlPod() (ns, name string) {
	GinkgoHelper()
	ns = newNamespace()
	return ns, startProbePod(ns, "control")
}

// startProbePod runs such a pod in namespace ns (what any tenant may create there).
func startProbePod(ns, name string) string {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			RuntimeClassName:             ptr.To("gvisor"),
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "probe", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"python3", "-c", "import time\nwhile True: time.sleep(3600)"},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning))
	}).WithTimeout(2 * time.Minute).Should(Succeed())
	return name
}

var _ = Describe("isolation of hostile code", Ordered, ContinueOnFailure, func() {
	var (
		ns, otherNS        string
		poolA, poolB       *sandboxv1alpha1.SandboxPool
		otherPool          *sandboxv1alpha1.SandboxPool
		controlNS, control string
		node, metadata     string
		nodePort           int
	)

	BeforeAll(func() {
		ns, otherNS = newNamespace(), newNamespace()
		poolA = warmPool(wrappers.Pool(ns, "a").Replicas(2))
		poolB = warmPool(wrappers.Pool(ns, "b").Replicas(1))
		otherPool = warmPool(wrappers.Pool(otherNS, "other").Replicas(1))
		controlNS, control = startControlPod()
		node, metadata = nodeAddress(), metadataAddress()
		nodePort = hostListener(node + ":0")
		hostListener(metadata + ":80")
	})

	It("reports the pool's NetworkPolicy in place", func() {
		got := &sandboxv1alpha1.SandboxPool{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(poolA), got)).To(Succeed())
			g.Expect(got.Status.Conditions).To(ContainElement(And(
				HaveField("Type", sandboxv1alpha1.PoolConditionNetworkPolicyReady), HaveField("Status", metav1.ConditionTrue))))
		}).Should(Succeed())
	})

	It("keeps code in a sandbox from reaching other sandboxes, the cluster, DNS and the outside", func() {
		api, apiPort := apiServerAddress()
		// Both pods of pool A: the code runs in one of them, and reaching its
		// own address is not a crossing (no policy applies to a pod's traffic to itself).
		peers := map[string]corev1.Pod{"agent-other-pool": idlePod(poolB), "agent-other-namespace": idlePod(otherPool)}
		Eventually(func(g Gomega) {
			pods := poolPods(g, poolA)
			g.Expect(pods).To(HaveLen(2))
			for i, p := range pods {
				g.Expect(sandboxpod.IsIdle(&p)).To(BeTrue(), "pod %s idle", p.Name)
				peers[fmt.Sprintf("agent-same-pool-%d", i)] = p
			}
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		targets := map[string]target{
			"apiserver-service": {Kind: "tcp", Host: "10.96.0.1", Port: 443},
			"apiserver-address": {Kind: "tcp", Host: api, Port: apiPort},
			"kubelet":           {Kind: "tcp", Host: node, Port: 10250},
			"manager-metrics":   {Kind: "tcp", Host: managerPodIP(), Port: 8443},
			"cluster-dns":       {Kind: "dns", Name: "kubernetes.default.svc.cluster.local"},
			"node-address":      {Kind: "tcp", Host: node, Port: nodePort},
			"metadata":          {Kind: "tcp", Host: metadata, Port: 80},
		}
		for name, p := range peers {
			targets[name] = target{Kind: "http", URL: agentURL(p)}
		}

		By("the control: an ordinary pod reaches the cluster, DNS and the host, but no agent (ingress is the manager's only)")
		ctl := probeFromPod(controlNS, control, targets)
		for _, name := range []string{"apiserver-service", "apiserver-address", "manager-metrics", "node-address", "metadata"} {
			Expect(ctl[name].Result).To(Equal("connected"), "control pod to %s: %s", name, ctl[name])
		}
		Expect(ctl["node-address"].Detail).To(HavePrefix("warmpool-e2e"), "the test's own server answered")
		Expect(ctl["metadata"].Detail).To(HavePrefix("warmpool-e2e"))
		Expect(ctl["cluster-dns"]).To(Equal(outcome{Result: "answered", Detail: "10.96.0.1"}), "cluster DNS works")
		Expect(ctl["kubelet"].Result).To(Equal("connected"), "the kubelet listens on the node's address")
		for name := range peers {
			Expect(ctl[name]).To(beBlocked(), "a non-manager pod must not reach %s: %s", name, ctl[name])
		}

		By("the attack: the same probes as an Execution's code; each must be stopped by the pool's policy")
		got, self := probeFromSandbox(ns, "a", "attack", targets)
		checked := 0
		for name := range targets {
			if p, ok := peers[name]; ok && p.Name == self {
				continue
			}
			checked++
			Expect(got[name]).To(beBlocked(), "sandbox code reached %s: %s (the control saw %s)", name, got[name], ctl[name])
		}
		Expect(checked).To(Equal(len(targets)-1), "the code ran in a pod of pool a (%s) and tried the other one", self)
	})

	It("gives the code no credential, and a token for one pod opens no other", func() {
		ex := execute(wrappers.Execution(ns, "creds").Pool("a").Code(`import os, json
found = {k: len(v) for k, v in os.environ.items() if any(w in k.upper() for w in ('TOKEN', 'SECRET', 'KEY', 'PASS'))}
paths = ['/var/run/warmpool', '/var/run/secrets', '/run/secrets']
print(json.dumps({'env': found, 'paths': [p for p in paths if os.path.exists(p)]}))`).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(strings.TrimSpace(ex.Status.Stdout)).To(Equal(`{"env": {}, "paths": []}`))

		By("from the node (which the policy admits, for the kubelet's probes): a token for pod A opens A and not B")
		a, b := idlePod(poolA), idlePod(otherPool)
		tokA := agentToken(a)
		Expect(agentStatus(a, tokA)).NotTo(Equal(http.StatusUnauthorized), "pod A's own token opens pod A")
		Expect(agentStatus(b, tokA)).To(Equal(http.StatusUnauthorized), "pod A's token must not open pod B")
		Expect(agentStatus(b, "")).To(Equal(http.StatusUnauthorized))
	})

	It("lets a pool with an egress allowlist reach exactly what it allows", func() {
		closedPort := hostListener(node + ":0") // listening, but not allowed
		egress := wrappers.Pool(ns, "egress").Replicas(1).Image(image).Obj()
		egress.Spec.Network = &sandboxv1alpha1.NetworkSpec{Egress: []sandboxv1alpha1.EgressRule{
			{CIDR: node + "/32", Ports: []sandboxv1alpha1.EgressPort{{Port: int32(nodePort)}}},
			// Everything on port 80: the metadata address must stay cut out of it.
			{CIDR: "0.0.0.0/0", Ports: []sandboxv1alpha1.EgressPort{{Port: 80}}},
		}}
		Expect(k8s.Create(ctx, egress)).To(Succeed())
		waitWarm(egress)
		got, _ := probeFromSandbox(ns, "egress", "allowlist", map[string]target{
			"allowed":           {Kind: "tcp", Host: node, Port: nodePort},
			"other-port":        {Kind: "tcp", Host: node, Port: closedPort},
			"metadata":          {Kind: "tcp", Host: metadata, Port: 80},
			"apiserver-service": {Kind: "tcp", Host: "10.96.0.1", Port: 443},
			"cluster-dns":       {Kind: "dns", Name: "kubernetes.default.svc.cluster.local"},
		})
		Expect(got["allowed"].Result).To(Equal("connected"), "%s", got["allowed"])
		Expect(got["allowed"].Detail).To(HavePrefix("warmpool-e2e"))
		for _, name := range []string{"other-port", "metadata", "apiserver-service", "cluster-dns"} {
			Expect(got[name]).To(beBlocked(), "%s: %s", name, got[name])
		}
	})

	It("fails an Execution whose codeFrom names a Secret not marked for it, saying why", func() {
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
			StringData: map[string]string{"password": "hunter2"}})).To(Succeed())
		ex := wrappers.Execution(ns, "steal").Pool("a").NoCode().CodeFromSecret("db", "password").Obj()
		got := execute(ex)
		Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseFailed))
		Expect(got.Status.Error).NotTo(BeNil())
		Expect(got.Status.Error.Type).To(Equal(sandboxv1alpha1.ReasonCodeSourceNotMarked))
		Expect(got.Status.Error.Message).To(ContainSubstring("sandbox.warmpool.dev/code=true"))
		Expect(got.Status.Error.Message + got.Status.Stdout + got.Status.Result).NotTo(ContainSubstring("hunter2"))
	})

	It("rejects a pool that sets the operator's reserved keys in its template", func() {
		pool := wrappers.Pool(ns, "born-claimed").Image(image).Obj()
		pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{Metadata: sandboxv1alpha1.SandboxPodMetadata{
			Annotations: map[string]string{sandboxpod.AnnotationClaimedUID: "x"}}}
		err := k8s.Create(ctx, pool)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("reserved for the operator"))
	})

	It("separates tenants through the aggregated edit and view roles", func() {
		bindRole(ns, "alice", "edit")
		bindRole(ns, "bob", "view")
		// The cluster's aggregation controller folds our roles into edit and view.
		Eventually(func() string { return can("alice", "create", "executions.sandbox.warmpool.dev", ns) }).
			WithTimeout(time.Minute).Should(Equal("yes"))
		Expect(can("alice", "patch", "executions.sandbox.warmpool.dev", ns)).To(Equal("yes"))
		Expect(can("alice", "create", "executions.sandbox.warmpool.dev", otherNS)).To(Equal("no"))
		Expect(can("alice", "get", "executions.sandbox.warmpool.dev", otherNS)).To(Equal("no"))
		Expect(can("alice", "patch", "executions.sandbox.warmpool.dev", otherNS)).To(Equal("no"), "cancelling is a patch of spec")
		Expect(can("alice", "delete", "executions.sandbox.warmpool.dev", otherNS)).To(Equal("no"))
		Expect(can("alice", "get", "sandboxpools.sandbox.warmpool.dev", otherNS)).To(Equal("no"))
		Expect(can("alice", "update", "executions.sandbox.warmpool.dev", ns, "--subresource", "status")).To(Equal("no"))
		Expect(can("bob", "get", "executions.sandbox.warmpool.dev", ns)).To(Equal("yes"))
		Expect(can("bob", "create", "executions.sandbox.warmpool.dev", ns)).To(Equal("no"))

		By("alice creating an Execution in the other tenant's namespace is forbidden")
		manifest := fmt.Sprintf("apiVersion: sandbox.warmpool.dev/v1alpha1\nkind: Execution\nmetadata: {name: intrude, namespace: %s}\n"+
			"spec: {poolRef: {name: other}, code: \"print(1)\"}\n", otherNS)
		cmd := exec.Command(kubectl(), "create", "--as", "alice", "-f", "-")
		cmd.Stdin = strings.NewReader(manifest)
		out, err := cmd.CombinedOutput()
		Expect(err).To(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("forbidden"))
	})

	It("refuses to evict a busy sandbox (drains wait for the code), but lets idle ones go", func() {
		// Three busy pods on a pool of two warm replicas: busy pods are beyond
		// the warm count, and a budget that took its expected count from the
		// pool's scale (maxUnavailable: 0) let the surplus go.
		var long []*sandboxv1alpha1.Execution
		for i := range 3 {
			ex := wrappers.Execution(ns, fmt.Sprintf("long-%d", i)).Pool("a").Timeout(2 * time.Minute).Code("import time\ntime.sleep(100)").Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			long = append(long, ex)
		}
		busy := map[string]bool{}
		Eventually(func(g Gomega) {
			for _, ex := range long {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), ex)).To(Succeed())
				g.Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning), ex.Name)
				busy[ex.Status.PodName] = true
			}
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		By("waiting for the disruption controller to count the three busy pods")
		Eventually(func(g Gomega) {
			pdb := &policyv1.PodDisruptionBudget{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, pdb)).To(Succeed())
			g.Expect(pdb.Status.ObservedGeneration).To(Equal(pdb.Generation))
			g.Expect(pdb.Status.CurrentHealthy).To(BeNumerically("==", 3))
		}).WithTimeout(time.Minute).Should(Succeed())
		evict := func(name string) error {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			return k8s.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: pod.ObjectMeta})
		}
		for name := range busy {
			err := evict(name)
			Expect(apierrors.IsTooManyRequests(err)).To(BeTrue(), "evicting the busy pod %s: want 429 from the disruption budget, got %v", name, err)
			Expect(err.Error()).To(ContainSubstring("disruption budget"))
		}

		var idle corev1.Pod
		Eventually(func(g Gomega) {
			for _, p := range poolPods(g, poolA) {
				if !busy[p.Name] && sandboxpod.IsIdle(&p) {
					idle = p
					return
				}
			}
			g.Expect(false).To(BeTrue(), "an idle pod besides the busy ones")
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(evict(idle.Name)).To(Succeed(), "an idle pod is evictable: the pool replaces it")

		for _, ex := range long {
			patch := client.MergeFrom(ex.DeepCopy())
			ex.Spec.Cancel = true
			Expect(k8s.Patch(ctx, ex, patch)).To(Succeed())
		}
		for _, ex := range long {
			Expect(finished(ex, time.Minute).Status.Phase).To(Equal(sandboxv1alpha1.PhaseCancelled))
		}
	})

	It("keeps warm pods in a namespace that enforces Pod Security 'restricted'", func() {
		restricted := newNamespace()
		nsObj := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: restricted}, nsObj)).To(Succeed())
		nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		Expect(k8s.Update(ctx, nsObj)).To(Succeed())
		warmPool(wrappers.Pool(restricted, "py").Replicas(1))
		ex := execute(wrappers.Execution(restricted, "hi").Pool("py").Code("print('restricted')").Obj())
		Expect(ex.Status.Stdout).To(Equal("restricted\n"))
	})
})
