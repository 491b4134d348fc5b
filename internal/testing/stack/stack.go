// Package stack runs warmpool as a cluster does, for test suites outside the
// controller package (client libraries, the MCP server): envtest's
// kube-apiserver and etcd, the test kubelet running real agents with a real
// python3, and the manager with its data plane registered as an APIService,
// so that a client with nothing but a kubeconfig reaches Sessions the way it
// would on a cluster. It has no fault injection; the controller suite has.
package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/dataplane"
	"github.com/warmpool/warmpool/internal/testing/localkubelet"
	"github.com/warmpool/warmpool/internal/testing/testenv"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// ManagerNamespace stands for warmpool-system: the agent keys and the data
// plane's certificate live there.
const ManagerNamespace = "warmpool-system"

// Stack is a running control plane, kubelet and manager.
type Stack struct {
	Env     *testenv.Env
	Kubelet *localkubelet.Kubelet
	// Manager is the manager's own configuration (controller.Config), for
	// tests that need to know what it was started with.
	Manager controller.Config

	dir     string
	cancel  context.CancelFunc
	cleanup []func()
}

// Options tune the stack; the zero value is what a cluster has.
type Options struct {
	// Log receives the manager's and the kubelet's logs; discarded when unset.
	Log logr.Logger
	// Configure, when set, changes the manager's configuration before it starts.
	Configure func(*controller.Config)
	// PodStartDelay holds every sandbox pod back this long before its agent
	// starts, as image pulls and sandbox boots do on a node.
	PodStartDelay time.Duration
}

// Start brings the stack up. Stop takes it down, also after an error here.
func Start(opts Options) (s *Stack, err error) {
	s = &Stack{}
	defer func() {
		if err != nil {
			s.Stop()
			s = nil
		}
	}()
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	ctrl.SetLogger(opts.Log)
	if s.Env, err = testenv.Start(); err != nil {
		return s, err
	}
	env := s.Env
	s.defer_(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	c := env.Client

	// The RuntimeClass config/ installs: the API server refuses pods naming a missing one.
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "runtimeclass", "runtimeclass.yaml"))
	if err != nil {
		return s, err
	}
	rc := &nodev1.RuntimeClass{}
	if err := yaml.Unmarshal(data, rc); err != nil {
		return s, err
	}
	if err := c.Create(ctx, rc); err != nil {
		return s, fmt.Errorf("create RuntimeClass: %w", err)
	}
	// The roles config/rbac gives users, so that tests act as users with them.
	for _, f := range []string{"session_editor_role.yaml", "session_viewer_role.yaml", "execution_editor_role.yaml", "sandboxpool_viewer_role.yaml"} {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", f))
		if err != nil {
			return s, err
		}
		role := &rbacv1.ClusterRole{}
		if err := yaml.Unmarshal(data, role); err != nil {
			return s, fmt.Errorf("%s: %w", f, err)
		}
		if err := c.Create(ctx, role); err != nil {
			return s, fmt.Errorf("create ClusterRole from %s: %w", f, err)
		}
	}

	if s.dir, err = os.MkdirTemp("", "warmpool-stack-"); err != nil {
		return s, err
	}
	dir := s.dir
	s.defer_(func() { _ = os.RemoveAll(dir) })
	agent := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", agent, "./cmd/agent")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return s, fmt.Errorf("build the agent: %w\n%s", err, out)
	}

	// The kubelet runs in a manager of its own, as on a cluster.
	kmgr, err := ctrl.NewManager(env.Config, managerOptions(env))
	if err != nil {
		return s, err
	}
	s.Kubelet = &localkubelet.Kubelet{Client: kmgr.GetClient(), AgentBinary: agent, Dir: dir, Log: opts.Log.WithName("kubelet"),
		StartDelay: opts.PodStartDelay}
	if err := s.Kubelet.SetupWithManager(kmgr); err != nil {
		return s, err
	}
	kubelet := s.Kubelet
	s.defer_(kubelet.StopAll)
	go func() { _ = kmgr.Start(ctx) }()

	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); err != nil {
		return s, err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return s, err
	}
	// The data plane delegates authentication and authorisation to the API
	// server as its own user (in a cluster: its ServiceAccount).
	kubeconfig, err := env.KubeconfigFor("warmpool-data-plane", "system:masters")
	if err != nil {
		return s, err
	}
	s.defer_(func() { _ = os.Remove(kubeconfig) })
	s.Manager = controller.Config{ManagerNamespace: ManagerNamespace, Resolver: kubelet,
		DataPlane: &dataplane.Options{BindAddress: "127.0.0.1", Port: port, RemoteKubeConfig: kubeconfig,
			// A stop stands for a crash here: no drain (dataplane.Options).
			DrainTimeout: -1}}
	if opts.Configure != nil {
		opts.Configure(&s.Manager)
	}
	mopts := managerOptions(env)
	mopts.Cache = controller.CacheOptions(s.Manager.KeysSecret())
	mgr, err := ctrl.NewManager(env.Config, mopts)
	if err != nil {
		return s, err
	}
	if err := controller.Setup(ctx, mgr, s.Manager); err != nil {
		return s, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	// Before the kubelet's agents stop: the manager would otherwise spend its
	// last moments replacing pods whose agents went away.
	s.defer_(func() { cancel(); <-done })
	if err := env.RegisterAPIService(ctx, dataplane.Group, dataplane.Version, port); err != nil {
		return s, err
	}
	return s, nil
}

func (s *Stack) defer_(f func()) { s.cleanup = append(s.cleanup, f) }

// Stop stops the manager, the agents and the control plane, in that order.
func (s *Stack) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.cleanup = nil
}

func managerOptions(env *testenv.Env) ctrl.Options {
	return ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Two managers (the kubelet's and warmpool's) in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}}
}

// Namespace creates a namespace whose name starts with prefix.
func (s *Stack) Namespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := s.Env.Client.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	return ns.Name, nil
}

// WarmPool creates a pool of replicas idle pods in namespace and waits until
// they are all idle.
func (s *Stack) WarmPool(ctx context.Context, namespace, name string, replicas int32) error {
	pool := wrappers.Pool(namespace, name).Replicas(replicas).Obj()
	if err := s.Env.Client.Create(ctx, pool); err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := &sandboxv1alpha1.SandboxPool{}
		err := s.Env.Client.Get(ctx, client.ObjectKeyFromObject(pool), got)
		if err == nil && got.Status.IdleReplicas >= replicas {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s/%s not warm after 2 minutes (idle %d of %d, err %v)",
				namespace, name, got.Status.IdleReplicas, replicas, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SessionsClient is a Sessions client of a new user bound in namespace to
// session-editor-role, as a person using Sessions is.
func (s *Stack) SessionsClient(ctx context.Context, namespace, user string) (*sessions.Client, error) {
	kubeconfig, err := s.UserKubeconfig(ctx, namespace, user, "session-editor-role")
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of %s: %w", user, err)
	}
	return sessions.New(cfg)
}

// UserKubeconfig writes a kubeconfig of a new user (a client certificate, as
// a person's kubeconfig holds) bound in namespace to the named ClusterRoles
// (those of config/rbac, for instance "session-editor-role").
func (s *Stack) UserKubeconfig(ctx context.Context, namespace, user string, clusterRoles ...string) (string, error) {
	for _, role := range clusterRoles {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := s.Env.Client.Create(ctx, rb); err != nil {
			return "", fmt.Errorf("bind %s to %s: %w", user, role, err)
		}
	}
	path, err := s.Env.KubeconfigFor(user)
	if err != nil {
		return "", errors.Join(fmt.Errorf("kubeconfig of %s", user), err)
	}
	return path, nil
}
