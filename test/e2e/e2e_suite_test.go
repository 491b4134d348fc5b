//go:build e2e

// Package e2e runs warmpool on a real cluster the way a user does: `make
// deploy`, then pools and Executions through the API and kubectl. It needs
// KUBECONFIG to point at a cluster that has the project's images and gVisor
// (`make test-e2e` brings up the local cluster when none is given; on kind,
// `make kind-up kind-load` first).
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

var (
	ctx = context.Background()
	k8s client.Client
	// restConfig is the suite's kubeconfig (the cluster admin's).
	restConfig *rest.Config
	// image is the sandbox image the pools of this suite run.
	image = envOr("E2E_REPL_IMAGE", "warmpool.dev/repl:dev")
	// dataImage is the data-science sandbox image (pandas, matplotlib...).
	dataImage = envOr("E2E_REPL_DATA_IMAGE", "warmpool.dev/repl-data:dev")
	// managerImage is the manager's image, for the Helm chart's values (make
	// deploy takes it from config/manager).
	managerImage = envOr("E2E_MANAGER_IMAGE", "warmpool.dev/manager:dev")
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	RunSpecs(t, "warmpool e2e suite")
}

var _ = BeforeSuite(func() {
	Expect(os.Getenv("KUBECONFIG")).NotTo(BeEmpty(), "set KUBECONFIG, or run `make test-e2e`, which brings up the local cluster")
	cfg, err := config.GetConfig()
	Expect(err).NotTo(HaveOccurred())
	restConfig = cfg
	scheme := clientgoscheme.Scheme
	Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	By("deploying the operator with make deploy")
	run("make", "-C", repoRoot(), "--no-print-directory", "deploy")
	if clusterWorkers() > 0 {
		// One rollout that both runs the image just loaded and keeps the
		// manager off the workers the multi-node specs drain and stop.
		pinToControlPlane("warmpool-system", managerDeployments...)
	} else {
		restartManager("warmpool-system")
	}
	scaleManager(managerReplicas)
})

// clusterWorkers is how many workers the cluster has besides its control-plane
// node, as the script that made it says (E2E_WORKERS; 0: one node).
func clusterWorkers() int {
	n, _ := strconv.Atoi(os.Getenv("E2E_WORKERS"))
	return n
}

// pinToControlPlane runs the Deployments of ns on the control-plane node
// (tolerating its taint), as a platform keeps its system pods off its
// sandbox nodes, and waits for them; the restart annotation makes the
// rollout happen even when they were pinned already.
func pinToControlPlane(ns string, deployments ...string) {
	GinkgoHelper()
	patch := fmt.Sprintf(`{"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": %q}},
		"spec": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
		"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}}}}`,
		time.Now().Format(time.RFC3339Nano))
	for _, d := range deployments {
		run(kubectl(), "-n", ns, "patch", d, "-p", patch)
	}
	for _, d := range deployments {
		run(kubectl(), "-n", ns, "rollout", "status", d, "--timeout=180s")
	}
}

// managerDeployments are the two Deployments of the manager's image: the
// controllers and the data plane.
var managerDeployments = []string{"deployment/warmpool-controller-manager", "deployment/warmpool-data-plane"}

// restartManager restarts both Deployments in ns and waits for them. The
// image tag stays the same across builds (:dev): restarting makes them run
// the image that was just built and loaded, not an older one.
func restartManager(ns string) {
	GinkgoHelper()
	run(kubectl(), append([]string{"-n", ns, "rollout", "restart"}, managerDeployments...)...)
	for _, d := range managerDeployments {
		run(kubectl(), "-n", ns, "rollout", "status", d, "--timeout=180s")
	}
}

// managerReplicas is how many replicas of the controllers the suite runs (one
// leads, the others wait to take over): two unless E2E_MANAGER_REPLICAS says.
var managerReplicas = envOr("E2E_MANAGER_REPLICAS", "2")

// scaleManager runs n replicas of the controllers and waits until each is
// Ready (which includes having loaded the agent signing keys).
func scaleManager(n string) {
	GinkgoHelper()
	run(kubectl(), "-n", "warmpool-system", "scale", "deployment/warmpool-controller-manager", "--replicas="+n)
	run(kubectl(), "-n", "warmpool-system", "rollout", "status", "deployment/warmpool-controller-manager", "--timeout=180s")
}

var _ = ReportAfterSuite("manager logs on failure", func(r Report) {
	if r.SuiteSucceeded {
		return
	}
	for _, d := range managerDeployments {
		out, _ := kubectlOut("-n", "warmpool-system", "logs", d, "--tail=60")
		fmt.Fprintf(GinkgoWriter, "%s logs (last 60 lines):\n%s\n", d, out)
	}
	out, _ := kubectlOut("get", "sandboxpools,executions,pods", "-A", "-o", "wide")
	fmt.Fprintf(GinkgoWriter, "objects:\n%s\n", out)
})

// repoRoot is the root of the source tree, where the Makefile and config/ are.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// kubectl is the binary the Makefile built (KUBECTL), else one on PATH.
func kubectl() string { return envOr("KUBECTL", "kubectl") }

// helm is the binary the Makefile built (HELM), else one on PATH.
func helm() string { return envOr("HELM", "helm") }

func kubectlOut(args ...string) (string, error) {
	cmd := exec.Command(kubectl(), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// run runs a command to its end and fails the spec, with its output, if it fails.
func run(name string, args ...string) string {
	GinkgoHelper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectl())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	Expect(cmd.Run()).To(Succeed(), "%s %s:\n%s", name, strings.Join(args, " "), out.String())
	return out.String()
}

// newNamespace makes a namespace for one spec, deleted after it.
func newNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}
