//go:build e2e

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The Python client's RLM environment against the cluster: the reference
// RLM's REPL protocol (clients/python/tests/test_rlm_protocol.py), a
// three-turn persistent conversation among it, in gVisor pods through the
// aggregated data plane. The reference package itself cannot be installed
// here; the suite drives its calls, in its order, with a stand-in of its
// module layout (docs/clients.md has the reference's own suites' counts).
var _ = Describe("the Python client's RLM environment", Label("pyclient"), func() {
	It("holds the reference RLM's REPL protocol, three persistent turns among it, in gVisor pods", func() {
		py := cmp.Or(os.Getenv("WARMPOOL_PYTHON"), "/usr/bin/python3")
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "python").Replicas(2).Timeout(30 * time.Second).GracePeriod(2 * time.Second))
		kubeconfig, err := filepath.Abs(os.Getenv("KUBECONFIG"))
		Expect(err).NotTo(HaveOccurred())
		cmd := exec.Command(py, "-m", "pytest", "-v", "-p", "no:cacheprovider", "clients/python/tests/test_rlm_protocol.py")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(),
			"PYTHONPATH="+filepath.Join(testenv.RepoRoot(), "clients", "python"),
			"PYTHONDONTWRITEBYTECODE=1",
			"WARMPOOL_TEST_KUBECONFIG="+kubeconfig,
			// This file's tests use only the editor's kubeconfig.
			"WARMPOOL_TEST_KUBECONFIG_VIEWER="+kubeconfig,
			"WARMPOOL_TEST_KUBECONFIG_OTHER="+kubeconfig,
			"WARMPOOL_TEST_NAMESPACE="+ns,
			"WARMPOOL_TEST_POOL=python",
		)
		out, err := cmd.CombinedOutput()
		fmt.Fprintf(GinkgoWriter, "pytest:\n%s\n", out)
		Expect(err).NotTo(HaveOccurred(), "pytest:\n%s", out)
		Expect(string(out)).To(ContainSubstring("test_a_three_turn_conversation_through_the_rlm_protocol PASSED"))
	})
})
