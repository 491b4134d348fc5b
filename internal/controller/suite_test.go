package controller_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/dataplane"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

var (
	env     *testenv.Env
	k8s     client.Client
	kubelet *localkubelet.Kubelet
	ctx     = context.Background()

	stopManager context.CancelFunc
	managerDone chan struct{}
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	RunSpecs(t, "Controller suite (envtest, real agents)")
}

func managerOptions() ctrl.Options {
	return ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// The suite starts the manager again to test restarts.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	// Cleanups run last-in first-out: the control plane stops after everything else.
	DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
	k8s = env.Client

	// The RuntimeClass that config/ installs; the API server refuses pods naming a missing one.
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "runtimeclass", "runtimeclass.yaml"))
	Expect(err).NotTo(HaveOccurred())
	rc := &nodev1.RuntimeClass{}
	Expect(yaml.Unmarshal(data, rc)).To(Succeed())
	Expect(k8s.Create(ctx, rc)).To(Succeed())

	dir, err := os.MkdirTemp("", "warmpool-kubelet-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	agent := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", agent, "./cmd/agent")
	build.Dir = testenv.RepoRoot()
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))

	// The kubelet stand-in runs in a manager of its own, so that stopping the
	// warmpool manager leaves the "pods" running, as on a real cluster.
	kmgr, err := ctrl.NewManager(env.Config, managerOptions())
	Expect(err).NotTo(HaveOccurred())
	kubelet = &localkubelet.Kubelet{Client: kmgr.GetClient(), AgentBinary: agent, Dir: dir, Log: ctrl.Log.WithName("kubelet")}
	Expect(kubelet.SetupWithManager(kmgr)).To(Succeed())
	kctx, kcancel := context.WithCancel(context.Background())
	go func() { defer GinkgoRecover(); Expect(kmgr.Start(kctx)).To(Succeed()) }()
	DeferCleanup(func() { kcancel(); kubelet.StopAll() })

	// A real S3-compatible store (SeaweedFS) for the snapshots of suspended Sessions.
	store, err := objectstore.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(store.Stop)
	snapshotStore = store

	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}})).To(Succeed())
	port, err := testenv.FreePort()
	Expect(err).NotTo(HaveOccurred())
	// The data plane delegates authentication and authorisation to the API
	// server as its own user (in a cluster: its ServiceAccount).
	kubeconfig, err := env.KubeconfigFor("warmpool-data-plane", "system:masters")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.Remove, kubeconfig)
	dataPlane = dataplane.Options{BindAddress: "127.0.0.1", Port: port, RemoteKubeConfig: kubeconfig,
		// A stop stands for a crash here: no drain (dataplane.Options).
		DrainTimeout: -1}
	startManager()
	Expect(env.RegisterAPIService(ctx, dataplane.Group, dataplane.Version, port)).To(Succeed())
	DeferCleanup(func() {
		stopManager()
		<-managerDone
	})
})

// crashBefore, when set, makes the manager "die" (stop at once, the write
// refused) when it is about to write an Execution status it matches: a power
// cut between two writes.
var crashBefore atomic.Pointer[func(*sandboxv1alpha1.Execution) bool]

// crashAfter, when set, makes the manager "die" just after it stored an
// Execution status it matches, before it acts on it.
var crashAfter atomic.Pointer[func(*sandboxv1alpha1.Execution) bool]

// crashBeforeFinalStatus arms crashBefore for the final status of the named Execution.
func crashBeforeFinalStatus(name string) {
	f := func(ex *sandboxv1alpha1.Execution) bool { return ex.Name == name && ex.Status.Phase.IsFinished() }
	crashBefore.Store(&f)
}

// podUpdateHook, when set, sees each pod update of the manager before it is
// sent: it may delay it, or crash the manager (crash) and refuse it.
var podUpdateHook atomic.Pointer[func(pod *corev1.Pod, crash func()) error]

// crashAfterPodUpdate, when set, makes the manager "die" just after it
// stored a pod update it matches, before it acts on it.
var crashAfterPodUpdate atomic.Pointer[func(*corev1.Pod) bool]

// claimLoses, when set, names an Execution whose next claim of a pod fails
// with a conflict, as when another Execution claimed the pod first.
var claimLoses atomic.Pointer[string]

// podDeleteFails, when set, fails the manager's deletes of the pods it
// matches, as an API server that does not answer them.
var podDeleteFails atomic.Pointer[func(*corev1.Pod) bool]

// staleView, when set, is what the manager's cache returns for that
// Execution until the manager tries to write its status: a watch that lags
// behind the API server (after a failover, or an API server restart).
var staleView atomic.Pointer[sandboxv1alpha1.Execution]

// startManager starts the warmpool manager, as cmd/manager does.
func startManager() {
	opts := managerOptions()
	cfg := managerConfig()
	opts.Cache = controller.CacheOptions(cfg.KeysSecret())
	// crash is a power cut: the manager stops, and from that moment nothing it
	// was still doing reaches the API server (its workers take a moment to
	// stop, and would otherwise go on writing).
	var cancelManager context.CancelFunc
	var dead atomic.Bool
	crash := func() { dead.Store(true); cancelManager() }
	errDead := errors.New("injected: the manager is dead")
	opts.NewClient = func(config *rest.Config, options client.Options) (client.Client, error) {
		c, err := client.NewWithWatch(config, options)
		if err != nil {
			return nil, err
		}
		c = interceptor.NewClient(c, interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if dead.Load() {
					return errDead
				}
				return c.Create(ctx, obj, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if dead.Load() {
					return errDead
				}
				return c.Patch(ctx, obj, patch, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if dead.Load() {
					return errDead
				}
				return c.Update(ctx, obj, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				if dead.Load() {
					return errDead
				}
				return c.Delete(ctx, obj, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if dead.Load() {
					return errDead
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if dead.Load() {
					return errDead
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		})
		return interceptor.NewClient(c, interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if ex, ok := obj.(*sandboxv1alpha1.Execution); ok {
					if stale := staleView.Load(); stale != nil && stale.Namespace == key.Namespace && stale.Name == key.Name {
						stale.DeepCopyInto(ex)
						return nil
					}
				}
				return c.Get(ctx, key, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if f := podUpdateHook.Load(); f != nil {
					if pod, ok := obj.(*corev1.Pod); ok {
						if err := (*f)(pod, crash); err != nil {
							return err
						}
					}
				}
				if name := claimLoses.Load(); name != nil && obj.GetAnnotations()[sandboxpod.AnnotationClaimedBy] == *name {
					claimLoses.Store(nil)
					return apierrors.NewConflict(corev1.Resource("pods"), obj.GetName(), errors.New("injected: claimed by another Execution first"))
				}
				err := c.Update(ctx, obj, opts...)
				if f := crashAfterPodUpdate.Load(); f != nil && err == nil {
					if pod, ok := obj.(*corev1.Pod); ok && (*f)(pod) {
						crashAfterPodUpdate.Store(nil)
						crash()
						return errors.New("injected: the manager died just after this write")
					}
				}
				return err
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				if f, pod := podDeleteFails.Load(), (*corev1.Pod)(nil); f != nil {
					if pod, _ = obj.(*corev1.Pod); pod != nil && (*f)(pod) {
						return apierrors.NewServiceUnavailable("injected: the pod's delete did not get through")
					}
				}
				return c.Delete(ctx, obj, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if ses, ok := obj.(*sandboxv1alpha1.Session); ok && sub == "status" {
					if f := crashBeforeSessionStatus.Load(); f != nil && (*f)(ses) {
						crashBeforeSessionStatus.Store(nil)
						crash()
						return errors.New("injected: the manager died before this write")
					}
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if ex, ok := obj.(*sandboxv1alpha1.Execution); ok && sub == "status" {
					if stale := staleView.Load(); stale != nil && stale.UID == ex.UID {
						staleView.Store(nil)
					}
					if f := crashBefore.Load(); f != nil && (*f)(ex) {
						crashBefore.Store(nil)
						crash()
						return errors.New("injected: the manager died before this write")
					}
				}
				err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
				if ex, ok := obj.(*sandboxv1alpha1.Execution); ok && sub == "status" && err == nil {
					if f := crashAfter.Load(); f != nil && (*f)(ex) {
						crashAfter.Store(nil)
						crash()
						return errors.New("injected: the manager died just after this write")
					}
				}
				return err
			},
		}), nil
	}
	// Every request of the manager passes managerCalls, which counts the
	// round trips of a path for the specs that ask.
	restCfg := rest.CopyConfig(env.Config)
	restCfg.Wrap(managerCalls.wrap)
	mgr, err := ctrl.NewManager(restCfg, opts)
	Expect(err).NotTo(HaveOccurred())
	mctx, cancel := context.WithCancel(context.Background())
	cancelManager = cancel
	Expect(controller.Setup(mctx, mgr, cfg)).To(Succeed())
	done := make(chan struct{})
	go func() { defer GinkgoRecover(); defer close(done); Expect(mgr.Start(mctx)).To(Succeed()) }()
	stopManager, managerDone = cancel, done
	managerStarted = time.Now()
}

// managerStarted is when the running manager started (and led: the suite's
// managers do not elect).
var managerStarted time.Time

// managerNamespace stands for warmpool-system: it holds the agent keys Secret.
const managerNamespace = "warmpool-system"

// dataPlane is where every manager of the suite serves the Sessions data
// plane; kube-apiserver's aggregator reaches it through an APIService.
var dataPlane dataplane.Options

func managerConfig() controller.Config {
	// A 10 s claim-rate window: an autoscaled pool comes down within the spec's patience.
	return controller.Config{ManagerNamespace: managerNamespace, Resolver: proxiedResolver{}, DataPlane: &dataPlane,
		AutoscaleWindow: 10 * time.Second, Clock: autoscaleClock,
		Snapshots: &controller.Snapshots{Store: snapshotStore.Config(snapshotBucket, "warmpool/")},
		// One 52 MB fork or suspend per namespace at a time (forks_test.go).
		MemoryBudget: suiteMemoryBudget}
}

// snapshotStore keeps the snapshots of the suite's suspended Sessions, in snapshotBucket.
var snapshotStore *objectstore.Server

const snapshotBucket = "warmpool-snapshots"

// crashBeforeSessionStatus, when set, makes the manager "die" when it is
// about to store a Session status it matches.
var crashBeforeSessionStatus atomic.Pointer[func(*sandboxv1alpha1.Session) bool]

// autoscaleClock is the managers' clock (Config.Clock, every reconciler's
// time policies): the wall clock, until a spec (the autoscaler's) freezes it
// and moves it only by its own steps, so that what it asserts does not
// depend on how fast the machine runs the spec.
var autoscaleClock = &steppedClock{}

type steppedClock struct {
	mu     sync.Mutex
	frozen bool
	at     time.Time
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		return c.at
	}
	return time.Now()
}

func (c *steppedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// freeze stops the clock at the wall clock's time, until the spec ends.
func (c *steppedClock) freeze() {
	c.mu.Lock()
	c.frozen, c.at = true, time.Now()
	c.mu.Unlock()
	DeferCleanup(func() {
		c.mu.Lock()
		c.frozen = false
		c.mu.Unlock()
	})
}

// step moves a frozen clock on by d and returns the new time.
func (c *steppedClock) step(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(d)
	return c.at
}

func restartManager() {
	stopManager()
	<-managerDone
	startManager()
}

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wp-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	// envtest runs no namespace or garbage collector: without this every pool of
	// every earlier spec stays warm, with a real python3 per pod, and a spec that
	// touches all pools (key rotation) waits on dozens of unrelated restarts.
	DeferCleanup(func() { cleanNamespace(ns.Name) })
	return ns.Name
}

// cleanNamespace stops what a spec left running in ns: pools first so nothing
// replaces the pods, then the pods (their agents stop with them).
func cleanNamespace(ns string) {
	in := client.InNamespace(ns)
	Expect(k8s.DeleteAllOf(ctx, &sandboxv1alpha1.Execution{}, in)).To(Succeed())
	Expect(k8s.DeleteAllOf(ctx, &sandboxv1alpha1.Session{}, in)).To(Succeed())
	Expect(k8s.DeleteAllOf(ctx, &sandboxv1alpha1.SandboxPool{}, in)).To(Succeed())
	Expect(k8s.DeleteAllOf(ctx, &corev1.Pod{}, in, client.GracePeriodSeconds(0))).To(Succeed())
	// envtest runs no garbage collector: a pool's NetworkPolicy and budget
	// would outlive it and make the next pool of its name in this namespace
	// fail to make its own ("exists and is not owned by the pool").
	Expect(k8s.DeleteAllOf(ctx, &networkingv1.NetworkPolicy{}, in)).To(Succeed())
	Expect(k8s.DeleteAllOf(ctx, &policyv1.PodDisruptionBudget{}, in)).To(Succeed())
}
