// Package sessions is the Go client of warmpool Sessions: create a Session
// (a lease on one warm, stateful Python interpreter of a SandboxPool), run
// code in it through the data plane (data.warmpool.dev) in milliseconds,
// streamed, with llm_query calls answered by the caller, and close it.
//
//	c, _ := sessions.New(restConfig)
//	s, _ := c.Create(ctx, "team-a", "nb-", "python", nil)
//	defer s.Close(context.Background())
//	res, _ := s.Run(ctx, sessions.ExecRequest{Code: "x = 6 * 7\nx"})
//	fmt.Println(*res.Result) // 42
//
// Requests go through kube-apiserver (its aggregation layer), so any
// credential of the kubeconfig works, and RBAC decides: running code needs
// "create" on sessions/exec in data.warmpool.dev for that Session.
package sessions

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Group and Version of the data plane.
const (
	Group   = "data.warmpool.dev"
	Version = "v1alpha1"
)

// Client creates Sessions and runs code in them.
type Client struct {
	objects client.WithWatch
	http    *http.Client
	base    string // API server URL, or the data plane's own for a direct connection
	me      *whoami
}

// whoami caches the user kube-apiserver authenticates the Client as.
type whoami struct {
	mu   sync.Mutex
	name string
}

// New returns a Client for the cluster of cfg.
func New(cfg *rest.Config) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// A logger of its own: a library must not make controller-runtime warn,
	// with a stack trace, that the program never set its global logger.
	objects, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Log: logr.New(crlog.NullLogSink{})})
	if err != nil {
		return nil, fmt.Errorf("client for Sessions: %w", err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("HTTP client for the data plane: %w", err)
	}
	return &Client{objects: objects, http: hc, base: strings.TrimRight(cfg.Host, "/"), me: &whoami{}}, nil
}

// WhoAmI returns the user kube-apiserver authenticates the Client as (a
// SelfSubjectReview, which every authenticated user may make; kubectl auth
// whoami), asked once.
func (c *Client) WhoAmI(ctx context.Context) (string, error) {
	c.me.mu.Lock()
	defer c.me.mu.Unlock()
	if c.me.name != "" {
		return c.me.name, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.objects.Create(ctx, review); err != nil {
		return "", fmt.Errorf("ask kube-apiserver who this client is (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("kube-apiserver names no user for this client's credentials")
	}
	c.me.name = review.Status.UserInfo.Username
	return c.me.name, nil
}

// WithDataPlane returns a copy of c that calls the data plane at base with
// hc directly instead of through the API server (the hop the benchmark
// measures; the data plane then authenticates hc's bearer token itself).
func (c *Client) WithDataPlane(base string, hc *http.Client) *Client {
	cp := *c
	cp.base, cp.http = strings.TrimRight(base, "/"), hc
	return &cp
}

// Options of a new Session.
type Options struct {
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	// Context is set as the variable `context` once; JSON when ContextJSON.
	Context     *string
	ContextJSON bool
	Env         map[string]string
	// OwnerOnly binds the Session to the caller (spec.access Owner): other
	// users of the namespace can neither run code in it nor read its
	// variables or files, whatever RBAC lets them do with Sessions.
	OwnerOnly bool
	// SuspendAfter suspends the Session once it is idle this long (its state
	// saved, its pod freed, resumed by its next run); nil: the pool's; 0: never.
	SuspendAfter *time.Duration
	// Checkpoint makes the Session durable (spec.checkpoint): its state is
	// checkpointed at most this often (0: after every run), and it resumes
	// from its last checkpoint when its pod or node is lost; nil: the pool's.
	Checkpoint *time.Duration
}

// Create makes a Session of pool ("name", or "namespace/name" for a shared
// pool of another namespace) in namespace (name ending in "-": a
// generated name with that prefix) and waits until it is Ready.
func (c *Client) Create(ctx context.Context, namespace, name, pool string, o *Options) (*Session, error) {
	obj := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: namespace},
		Spec: sandboxv1alpha1.SessionSpec{PoolRef: sandboxv1alpha1.ParsePoolReference(pool)}}
	if strings.HasSuffix(name, "-") {
		obj.GenerateName = name
	} else {
		obj.Name = name
	}
	// The creator is recorded whenever kube-apiserver says who the caller
	// is; a Session bound to its creator needs it.
	owner, err := c.WhoAmI(ctx)
	if err == nil {
		obj.Spec.Owner = owner
	} else if o != nil && o.OwnerOnly {
		return nil, fmt.Errorf("create a Session bound to its owner: %w", err)
	}
	if o != nil {
		if o.OwnerOnly {
			obj.Spec.Access = sandboxv1alpha1.SessionAccessOwner
		}
		if o.IdleTimeout > 0 {
			obj.Spec.IdleTimeout = &metav1.Duration{Duration: o.IdleTimeout}
		}
		if o.MaxLifetime > 0 {
			obj.Spec.MaxLifetime = &metav1.Duration{Duration: o.MaxLifetime}
		}
		if o.SuspendAfter != nil {
			obj.Spec.SuspendAfter = &metav1.Duration{Duration: *o.SuspendAfter}
		}
		if o.Checkpoint != nil {
			obj.Spec.Checkpoint = &sandboxv1alpha1.SessionCheckpointPolicy{Interval: &metav1.Duration{Duration: *o.Checkpoint}}
		}
		obj.Spec.Context = o.Context
		if o.ContextJSON {
			obj.Spec.ContextFormat = sandboxv1alpha1.ContextJSON
		}
		for k, v := range o.Env {
			obj.Spec.Env = append(obj.Spec.Env, sandboxv1alpha1.EnvVar{Name: k, Value: v})
		}
	}
	if err := c.objects.Create(ctx, obj); err != nil {
		return nil, fmt.Errorf("create Session: %w", err)
	}
	s := c.Open(namespace, obj.Name)
	if _, err := s.WaitReady(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// Open returns a handle on an existing Session.
func (c *Client) Open(namespace, name string) *Session {
	return &Session{c: c, Namespace: namespace, Name: name}
}
