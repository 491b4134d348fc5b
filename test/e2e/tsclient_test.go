//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/warmpool/warmpool/internal/testing/nodejs"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// The TypeScript client against the cluster: the RLM sandbox's behaviour
// suite on the warmpool backend (Sessions in gVisor pods through the
// aggregated data plane) and BashKit's Sandbox on the sandbox image's own
// shell and ripgrep, with the packed package installed as a user does.
var _ = Describe("the TypeScript client", Ordered, Label("tsclient"), func() {
	It("passes the behaviour suite on the warmpool backend and BashKit's suite in gVisor pods", func() {
		t := GinkgoT()
		path := nodejs.Path(t)
		project := nodejs.Install(t, path)
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "python").Replicas(2).Timeout(30 * time.Second).GracePeriod(2 * time.Second))
		out, err := nodejs.Test(project, path, []string{
			"WARMPOOL_TS_BACKENDS=warmpool",
			"WARMPOOL_TEST_KUBECONFIG=" + os.Getenv("KUBECONFIG"),
			"WARMPOOL_TEST_NAMESPACE=" + ns,
			"WARMPOOL_TEST_POOL=python",
			"WARMPOOL_REPO=" + testenv.RepoRoot(),
			"KUBECONFIG=" + filepath.Join(t.TempDir(), "none"),
		})
		fmt.Fprintf(GinkgoWriter, "node --test:\n%s\n", out)
		Expect(err).NotTo(HaveOccurred(), "node --test:\n%s", out)
	})
})
