//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// useSnapshotStore runs SeaweedFS in the cluster (test/e2e/testdata) and
// points the controllers at it, unless they already are (the Helm spec
// deploys the manager anew, without it).
func useSnapshotStore() {
	GinkgoHelper()
	run(kubectl(), "apply", "-f", filepath.Join(repoRoot(), "test", "e2e", "testdata", "seaweedfs.yaml"))
	run(kubectl(), "-n", "warmpool-s3", "rollout", "status", "deployment/seaweedfs", "--timeout=180s")
	args := run(kubectl(), "-n", "warmpool-system", "get", "deployment/warmpool-controller-manager",
		"-o", "jsonpath={.spec.template.spec.containers[0].args}")
	if strings.Contains(args, "--snapshot-store-endpoint") {
		return
	}
	patch := `[
	{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--snapshot-store-endpoint=seaweedfs.warmpool-s3.svc:8333"},
	{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--snapshot-store-insecure"},
	{"op": "add", "path": "/spec/template/spec/containers/0/envFrom", "value": [{"secretRef": {"name": "warmpool-snapshot-store"}}]}]`
	run(kubectl(), "-n", "warmpool-system", "patch", "deployment/warmpool-controller-manager", "--type=json", "-p", patch)
	run(kubectl(), "-n", "warmpool-system", "rollout", "status", "deployment/warmpool-controller-manager", "--timeout=180s")
}

// Sessions that outlive their pod, on gVisor: snapshot and fork through the
// data plane, and suspend to a real S3 store in the cluster and resume on
// the next run, across a restart of the controllers.
var _ = Describe("Sessions that outlive their pod", Ordered, Label("suspend"), func() {
	var ns string
	var c *sessions.Client

	BeforeAll(func() {
		useSnapshotStore()
		ns = newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(2).SessionSuspendAfter(3 * time.Second))
		var err error
		c, err = sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
	})

	It("snapshots a Session, forks it into three that go on alone", func() {
		s, err := c.Create(ctx, ns, "src-", "py", &sessions.Options{IdleTimeout: time.Hour, SuspendAfter: ptrDuration(0)})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "x = 40\ndef bump(n):\n    global x\n    x += n\n    return x"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)

		out, err := s.Fork(ctx, sessions.ForkRequest{Count: 3})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.Sessions).To(HaveLen(3))
		for i, name := range out.Sessions {
			f := c.Open(ns, name)
			DeferCleanup(func() { _ = f.Close(context.Background()) })
			res, err := f.Run(ctx, sessions.ExecRequest{Code: "bump(" + string(rune('1'+i)) + ")"})
			Expect(err).NotTo(HaveOccurred())
			Expect(*res.Result).To(Equal([]string{"41", "42", "43"}[i]))
		}
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "x"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*res.Result).To(Equal("40"), "the source is where it was")
	})

	It("suspends an idle Session to the object store, frees its pod, and resumes it on the next run after the controllers restart", func() {
		s, err := c.Create(ctx, ns, "idle-", "py", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "import json\nstate = {'n': 41}\ndef f():\n    return state['n'] + 1\nopen('kept.txt', 'w').write('file')"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		ses, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		pod := ses.Status.PodName

		Eventually(func(g Gomega) {
			ses, err := s.Get(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionSuspended))
			g.Expect(ses.Status.Snapshot).NotTo(BeNil())
		}).WithTimeout(60 * time.Second).Should(Succeed())
		Eventually(func() bool {
			p := &corev1.Pod{}
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p)
			return err != nil || p.DeletionTimestamp != nil || p.Labels["sandbox.warmpool.dev/session"] == ""
		}).WithTimeout(60*time.Second).Should(BeTrue(), "the suspended Session's pod is freed")

		restartManager("warmpool-system")
		Eventually(func() error {
			res, err = s.Run(ctx, sessions.ExecRequest{Code: "(f(), json.dumps(state), open('kept.txt').read())"})
			return err
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal(`(42, '{"n": 41}', 'file')`))
		Expect(res.Resumed).To(BeTrue())
		ses, err = s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(ses.Status.Resumes).To(Equal(int32(1)))
		Expect(ses.Status.PodName).NotTo(Equal(pod))
	})
})

var _ = Describe("Durable Sessions", Label("suspend"), func() {
	It("resume from their last checkpoint on another gVisor pod when their pod is deleted, and the next run says which run the state is from", func() {
		useSnapshotStore()
		ns := newNamespace()
		warmPool(wrappers.Pool(ns, "py").Replicas(2))
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		s, err := c.Create(ctx, ns, "durable-", "py", &sessions.Options{Checkpoint: ptrDuration(0)})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "x = 41\nopen('kept.txt', 'w').write('file')"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(res.Run).To(BeEquivalentTo(1))
		// Its checkpoint after run 1 is stored; the status says so within seconds.
		Eventually(func(g Gomega) {
			ses, err := s.Get(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ses.Status.Checkpoint).NotTo(BeNil())
			g.Expect(ses.Status.Checkpoint.Run).To(BeEquivalentTo(1))
		}).WithTimeout(60 * time.Second).Should(Succeed())
		ses, err := s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		pod := ses.Status.PodName
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, client.GracePeriodSeconds(0))).To(Succeed())
		deleted := time.Now()

		Eventually(func(g Gomega) {
			ses, err := s.Get(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ses.Status.Phase).To(Equal(sandboxv1alpha1.SessionReady))
			g.Expect(ses.Status.PodName).NotTo(Equal(pod))
			g.Expect(ses.Status.LastMove).NotTo(BeNil())
			g.Expect(ses.Status.LastMove.Checkpoint).NotTo(BeNil())
		}).WithTimeout(2 * time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())
		ses, err = s.Get(ctx)
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("pod deleted -> Session Ready again from its checkpoint, seen after %s (its pause, from the recovery's start: %d ms)\n",
			time.Since(deleted), ses.Status.LastMove.PauseMillis)
		res, err = s.Run(ctx, sessions.ExecRequest{Code: "(x + 1, open('kept.txt').read())"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(*res.Result).To(Equal("(42, 'file')"))
		Expect(res.Moved).NotTo(BeNil(), "the first run after the recovery does not say it")
		Expect(res.Moved.Checkpoint).NotTo(BeNil())
		Expect(res.Moved.Run).To(BeEquivalentTo(1))
		Expect(res.Run).To(BeEquivalentTo(2))
	})
})

func ptrDuration(d time.Duration) *time.Duration { return &d }
