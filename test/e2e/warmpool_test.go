//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// warmPool creates a pool and waits until all its replicas are idle and Ready.
func warmPool(p *wrappers.PoolWrapper) *sandboxv1alpha1.SandboxPool {
	GinkgoHelper()
	pool := p.Image(image).Obj()
	Expect(k8s.Create(ctx, pool)).To(Succeed())
	waitWarm(pool)
	return pool
}

// waitWarm waits until the pool has spec.replicas idle pods, each Ready.
func waitWarm(pool *sandboxv1alpha1.SandboxPool) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		got := &sandboxv1alpha1.SandboxPool{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), got)).To(Succeed())
		g.Expect(got.Status.IdleReplicas).To(Equal(got.Spec.Replicas), "idle pods")
		g.Expect(readyPods(g, pool)).To(BeNumerically(">=", got.Spec.Replicas), "Ready pods")
	}).WithTimeout(3 * time.Minute).Should(Succeed())
}

func poolPods(g Gomega, pool *sandboxv1alpha1.SandboxPool) []corev1.Pod {
	pods := &corev1.PodList{}
	g.Expect(k8s.List(ctx, pods, client.InNamespace(pool.Namespace),
		client.MatchingLabels{sandboxpod.LabelPool: pool.Name})).To(Succeed())
	return pods.Items
}

func readyPods(g Gomega, pool *sandboxv1alpha1.SandboxPool) int32 {
	var n int32
	for _, p := range poolPods(g, pool) {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

// waitRunning waits up to a minute for the Execution to be Running, and reads it into ex.
func waitRunning(ex *sandboxv1alpha1.Execution) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), ex)).To(Succeed())
		g.Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseRunning))
	}).WithTimeout(time.Minute).Should(Succeed())
}

// finished waits for the Execution to reach a terminal phase and returns it.
func finished(ex *sandboxv1alpha1.Execution, timeout time.Duration) *sandboxv1alpha1.Execution {
	GinkgoHelper()
	got := &sandboxv1alpha1.Execution{}
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ex), got)).To(Succeed())
		g.Expect(got.Status.Phase).To(BeElementOf(sandboxv1alpha1.PhaseSucceeded, sandboxv1alpha1.PhaseFailed,
			sandboxv1alpha1.PhaseTimedOut, sandboxv1alpha1.PhaseCancelled))
	}).WithTimeout(timeout).Should(Succeed())
	return got
}

func execute(ex *sandboxv1alpha1.Execution) *sandboxv1alpha1.Execution {
	GinkgoHelper()
	Expect(k8s.Create(ctx, ex)).To(Succeed())
	return finished(ex, 2*time.Minute)
}

func hostKernel() string {
	var u syscall.Utsname
	Expect(syscall.Uname(&u)).To(Succeed())
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

var _ = Describe("warmpool on a real cluster", Ordered, ContinueOnFailure, func() {
	var ns string
	var pool *sandboxv1alpha1.SandboxPool

	BeforeAll(func() {
		ns = newNamespace()
		pool = warmPool(wrappers.Pool(ns, "py").Replicas(2).Timeout(30 * time.Second).GracePeriod(2 * time.Second))
	})

	It("runs the sandbox under gVisor", func() {
		for _, p := range poolPods(Default, pool) {
			Expect(p.Spec.RuntimeClassName).To(HaveValue(Equal("gvisor")), p.Name)
		}
		ex := execute(wrappers.Execution(ns, "kernel").Pool("py").
			Code("import os, platform\nprint(os.uname().release)\nplatform.system()").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		kernel := strings.TrimSpace(ex.Status.Stdout)
		// gVisor's Sentry is its own kernel and reports Linux 4.4.0, whatever the host runs.
		Expect(kernel).To(Equal("4.4.0"))
		Expect(kernel).NotTo(Equal(hostKernel()))
	})

	It("ends an Execution Succeeded with its output and result", func() {
		ex := execute(wrappers.Execution(ns, "hello").Pool("py").
			Code("import sys\nprint('hello', 6*7)\nprint('warn', file=sys.stderr)\n{'answer': 42}").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(ex.Status.Stdout).To(Equal("hello 42\n"))
		Expect(ex.Status.Stderr).To(Equal("warn\n"))
		Expect(ex.Status.Result).To(Equal("{'answer': 42}"))
		Expect(ex.Status.PodName).NotTo(BeEmpty())
	})

	It("ends a timeout TimedOut with the KeyboardInterrupt and partial output, deletes the pod and warms a replacement", func() {
		ex := execute(wrappers.Execution(ns, "slow").Pool("py").Timeout(3 * time.Second).
			Code("import time\nprint('started', flush=True)\ntime.sleep(600)").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseTimedOut), "%+v", ex.Status)
		Expect(ex.Status.Error).NotTo(BeNil())
		Expect(ex.Status.Error.Type).To(Equal("KeyboardInterrupt"))
		Expect(ex.Status.Stdout).To(ContainSubstring("started"))

		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ex.Status.PodName}, p)
			return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		}).WithTimeout(time.Minute).Should(BeTrue(), "the timed-out pod %s is deleted", ex.Status.PodName)
		waitWarm(pool)
		for _, p := range poolPods(Default, pool) {
			if p.DeletionTimestamp == nil {
				Expect(p.Name).NotTo(Equal(ex.Status.PodName), "the timed-out pod is not reused")
			}
		}
	})

	It("cancels a running Execution", func() {
		ex := wrappers.Execution(ns, "cancel-me").Pool("py").Timeout(5 * time.Minute).
			Code("import time\nprint('working', flush=True)\ntime.sleep(600)").Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		waitRunning(ex)
		patch := client.MergeFrom(ex.DeepCopy())
		ex.Spec.Cancel = true
		Expect(k8s.Patch(ctx, ex, patch)).To(Succeed())
		got := finished(ex, time.Minute)
		Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseCancelled), "%+v", got.Status)
	})

	It("keeps the security defaults on a running sandbox", func() {
		code := `import os
checks = {}
checks['uid'] = os.getuid()
checks['sa_token'] = os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token')
try:
    open('/rootfs-write-test', 'w')
    checks['root_writable'] = True
except OSError:
    checks['root_writable'] = False
caps = dict(l.split(':\t') for l in open('/proc/self/status').read().splitlines() if l.startswith('Cap'))
checks['cap_eff'] = caps['CapEff'].strip()
checks['cap_prm'] = caps['CapPrm'].strip()
# The interpreter runs in a user namespace of its own that maps only the
# sandbox's uid: a new user namespace's bounding set is full by the kernel's
# design, but bounds nothing the pod holds (no root is mapped, and with no
# new privileges nothing can gain a capability). Outside one, it is empty.
uid_map = open('/proc/self/uid_map').read().split()
checks['cap_bnd_empty_or_own_userns'] = caps['CapBnd'].strip() == '0000000000000000' or uid_map == ['65532', '65532', '1']
import ctypes
checks['no_new_privs'] = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0) == 1  # PR_GET_NO_NEW_PRIVS (gVisor's status has no line for it)
try:
    os.setuid(0)
    checks['setuid_root'] = True
except OSError:
    checks['setuid_root'] = False
checks['workspace_writable'] = os.access('/workspace', os.W_OK)
checks`
		ex := execute(wrappers.Execution(ns, "security").Pool("py").Code(code).Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(ex.Status.Result).To(And(
			ContainSubstring("'uid': 65532"),
			ContainSubstring("'sa_token': False"),
			ContainSubstring("'root_writable': False"),
			ContainSubstring("'cap_eff': '0000000000000000'"),
			ContainSubstring("'cap_prm': '0000000000000000'"),
			ContainSubstring("'cap_bnd_empty_or_own_userns': True"),
			ContainSubstring("'no_new_privs': True"),
			ContainSubstring("'setuid_root': False"),
			ContainSubstring("'workspace_writable': True"),
		))

		p := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ex.Status.PodName}, p)).To(Succeed())
		Expect(p.Spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
		c := p.Spec.Containers[0]
		Expect(c.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ContainElement(corev1.Capability("ALL")))
		for _, v := range p.Spec.Volumes {
			Expect(v.Projected).To(BeNil(), "no projected (service account) volume: %s", v.Name)
		}
	})

	It("refills the pool after a burst of 20 Executions on a pool of 3", func() {
		burst := warmPool(wrappers.Pool(ns, "burst").Replicas(3).MaxPods(6))
		var exs []*sandboxv1alpha1.Execution
		for i := range 20 {
			ex := wrappers.Execution(ns, fmt.Sprintf("burst-%02d", i)).Pool("burst").
				Code(fmt.Sprintf("print(%d * 2)", i)).Obj()
			Expect(k8s.Create(ctx, ex)).To(Succeed())
			exs = append(exs, ex)
		}
		start := time.Now()
		for i, ex := range exs {
			got := finished(ex, 5*time.Minute)
			Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%s: %+v", ex.Name, got.Status)
			Expect(got.Status.Stdout).To(Equal(fmt.Sprintf("%d\n", i*2)))
		}
		drained := time.Since(start)
		waitWarm(burst)
		AddReportEntry("burst of 20 on a pool of 3", fmt.Sprintf("all done %v after creation; refilled %v later",
			drained.Round(time.Millisecond), (time.Since(start)-drained).Round(time.Millisecond)))
	})

	It("preloads numpy from the image when the pool asks for it", func() {
		warmPool(wrappers.Pool(ns, "numpy").Preload("numpy"))
		ex := execute(wrappers.Execution(ns, "numpy").Pool("numpy").
			Code("import sys\n'numpy' in sys.modules and int(numpy.arange(10).sum())").Obj())
		Expect(ex.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", ex.Status)
		Expect(ex.Status.Result).To(Equal("45"))
	})
})

var _ = Describe("the samples, with kubectl", func() {
	It("runs config/samples/ to Succeeded", func() {
		ns := newNamespace()
		run(kubectl(), "-n", ns, "apply", "-f", filepath.Join(repoRoot(), "config", "samples")+"/")
		for _, name := range []string{"hello", "session-step-1", "session-step-2"} {
			run(kubectl(), "-n", ns, "wait", "--for=jsonpath={.status.phase}=Succeeded",
				"execution/"+name, "--timeout=180s")
		}
		out := run(kubectl(), "-n", ns, "get", "execution", "hello", "-o", "jsonpath={.status.stdout}")
		Expect(out).To(ContainSubstring("hello from warmpool"))
		// The Session sample, driven with kubectl alone as README shows.
		run(kubectl(), "-n", ns, "wait", "--for=jsonpath={.status.phase}=Ready", "session/notebook", "--timeout=180s")
		body := filepath.Join(GinkgoT().TempDir(), "exec.json")
		Expect(os.WriteFile(body, []byte(`{"code": "6 * 7"}`), 0o600)).To(Succeed())
		out = run(kubectl(), "create", "--raw", "/apis/data.warmpool.dev/v1alpha1/namespaces/"+ns+"/sessions/notebook/exec", "-f", body)
		Expect(out).To(ContainSubstring(`"result":"42"`))
	})
})
