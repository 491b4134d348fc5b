//go:build e2e

package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// kubectl warmpool from a fresh shell: the plugin on PATH, the real kubectl
// finding it, the cluster's kubeconfig, gVisor sandboxes behind it.
var _ = Describe("kubectl warmpool", Ordered, Label("plugin"), func() {
	var ns, bin string

	BeforeAll(func() {
		bin = GinkgoT().TempDir()
		run("go", "build", "-o", filepath.Join(bin, "kubectl-warmpool"), filepath.Join(repoRoot(), "cmd", "kubectl-warmpool"))
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "python").Replicas(1))
	})

	// plugin runs `kubectl warmpool ARGS -n NS` and returns its exit code and output.
	plugin := func(args ...string) (int, string, string) {
		cmd := exec.Command(kubectl(), append(append([]string{"warmpool"}, args...), "-n", ns)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			Expect(err).NotTo(HaveOccurred())
		}
		return code, out.String(), errOut.String()
	}

	It("runs code through a Session and as an Execution, with exit codes that say how it ended", func() {
		code, out, errOut := plugin("run", "-c", "print(1)", "--pool", "python")
		Expect(code).To(Equal(0), errOut)
		Expect(out).To(Equal("1\n"))

		code, out, errOut = plugin("run", "--via", "execution", "--pool", "python", "-c", "import platform\nprint('on', platform.system())\n1/0")
		Expect(code).To(Equal(1), "a code error exits 1")
		Expect(out).To(Equal("on Linux\n"))
		Expect(errOut).To(ContainSubstring("ZeroDivisionError"))
		name := regexp.MustCompile(`execution\.sandbox\.warmpool\.dev/(\S+) created`).FindStringSubmatch(errOut)
		Expect(name).NotTo(BeNil(), errOut)

		code, out, _ = plugin("logs", name[1], "--exit-code")
		Expect(code).To(Equal(1))
		Expect(out).To(Equal("on Linux\n"))

		code, out, errOut = plugin("run", "--pool", "python", "--timeout", "2s", "-c", "print('spin', flush=True)\nwhile True: pass")
		Expect(code).To(Equal(3), "a timeout exits 3: %s", errOut)
		Expect(out).To(Equal("spin\n"))
	})

	It("shows the pool in top", func() {
		code, out, errOut := plugin("top")
		Expect(code).To(Equal(0), errOut)
		Expect(out).To(MatchRegexp(`(?m)^NAME\s+REPLICAS\s+IDLE\s+BUSY\s+WARMING\s+WAITING\s+WARM-HIT\s+STARTUP\s+ROLLOUT\s+STATUS\s+AGE\npython\s+1\s`))
	})

	It("exits 4 on a Ctrl-C while waiting for a sandbox the scheduler cannot place, and top says why", func() {
		big := wrappers.Pool(ns, "big").Replicas(1).Obj()
		big.Spec.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500")}}
		Expect(k8s.Create(ctx, big)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, big) })

		cmd := exec.Command(kubectl(), "warmpool", "run", "--pool", "big", "-c", "print('ran')", "-n", ns)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		Expect(cmd.Start()).To(Succeed())
		Eventually(func(g Gomega) {
			list := &sandboxv1alpha1.SessionList{}
			g.Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			g.Expect(slices.ContainsFunc(list.Items, func(s sandboxv1alpha1.Session) bool { return s.Spec.PoolRef.Name == "big" })).To(BeTrue())
		}).WithTimeout(time.Minute).Should(Succeed())
		Expect(cmd.Process.Signal(os.Interrupt)).To(Succeed())
		err := cmd.Wait()
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue(), "%v: %s", err, errOut.String())
		Expect(ee.ExitCode()).To(Equal(4), "a Ctrl-C before the code ran is a cancel: %s", errOut.String())
		Expect(out.String()).To(BeEmpty())

		Eventually(func() string {
			_, out, errOut := plugin("top")
			return out + errOut
		}).WithTimeout(time.Minute).Should(And(MatchRegexp(`(?m)^big\s.*\sUnschedulable\s`), ContainSubstring("Insufficient cpu")))

		code, out2, errOut2 := plugin("version", "--context", "no-such-context")
		Expect(code).To(Equal(1), "%s%s", out2, errOut2)
		Expect(errOut2).To(ContainSubstring(`context "no-such-context" does not exist`))
	})
})
