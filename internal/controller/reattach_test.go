package controller_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

var _ = Describe("A connection reset between the manager and an agent", func() {
	It("mid-run is followed by the run's ID: the run ends with its own result, not SandboxLost", func() {
		ns := newNamespace()
		p := proxyNamespace(ns)
		DeferCleanup(func() {
			proxiesMu.Lock()
			delete(proxies, ns)
			proxiesMu.Unlock()
			p.close()
		})
		createPoolAndWait(wrappers.Pool(ns, "python").Obj())
		ex := wrappers.Execution(ns, "cut").Code("import time\nprint('before', flush=True)\ntime.sleep(2)\nprint('after')\n'done'").
			Timeout(30 * time.Second).Obj()
		Expect(k8s.Create(ctx, ex)).To(Succeed())
		Eventually(func() sandboxv1alpha1.ExecutionPhase { return getExec(ex).Status.Phase }).Should(Equal(sandboxv1alpha1.PhaseRunning))
		waitClaimed(ex)
		// The stream is open while the code sleeps: cut it.
		Eventually(p.reset, 5*time.Second, 50*time.Millisecond).Should(BeNumerically(">", 0))
		got := finished(ex)
		Expect(got.Status.Phase).To(Equal(sandboxv1alpha1.PhaseSucceeded), "%+v", got.Status)
		Expect(got.Status.Result).To(Equal("'done'"))
		Expect(got.Status.Stdout).To(Equal("before\nafter\n"))
	})
})
