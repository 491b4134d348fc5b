// Package testenv starts a real kube-apiserver and etcd (envtest) with the
// warmpool CRDs installed, for integration tests.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Env is a running control plane with a client that knows the warmpool types.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	Client client.Client
}

// RepoRoot is the root of the warmpool source tree.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// assets returns the directory with etcd and kube-apiserver: KUBEBUILDER_ASSETS
// when set (as `make test` does), else the cached build of hack/k8s-binaries.sh,
// building it first if needed, so a plain `go test ./...` works too.
func assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "k8s-binaries.sh"), "envtest")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build envtest binaries with hack/k8s-binaries.sh (or set KUBEBUILDER_ASSETS): %w", err)
	}
	return strings.TrimSpace(out.String()), nil
}

// Start starts etcd and kube-apiserver and installs the CRDs from
// config/crd/bases and the admission policies of config/admission, as make
// deploy does.
// The API server's aggregation layer is configured as on a real control
// plane, so that tests can register the data plane as an APIService.
func Start() (*Env, error) { return StartWith(nil) }

// StartWith is Start with kube-apiserver flags of the caller's on top of
// envtest's (the scale runs set the limits a large cluster's API server has).
func StartWith(apiServerFlags map[string]string) (*Env, error) {
	dir, err := assets()
	if err != nil {
		return nil, err
	}
	scheme := clientgoscheme.Scheme
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("add warmpool types to scheme: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	if err := enableAggregation(env); err != nil {
		return nil, fmt.Errorf("front-proxy certificates for envtest: %w", err)
	}
	for k, v := range apiServerFlags {
		env.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest from %s: %w", dir, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("client for envtest: %w", err)
	}
	if err := installAdmission(c); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Env{Environment: env, Config: cfg, Client: c}, nil
}

// installAdmission creates the objects of config/admission (plain manifests,
// the names final: kustomize changes nothing there).
func installAdmission(c client.Client) error {
	dir := filepath.Join(RepoRoot(), "config", "admission")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := c.Create(context.Background(), obj); err != nil {
			return fmt.Errorf("install %s: %w", f, err)
		}
	}
	return nil
}

// ClientAs returns a client that acts as user, member of groups, as
// `kubectl --as` does: the API server authorizes its requests with RBAC as
// that user's, not the admin's. Envtest's admin may impersonate anyone.
func (e *Env) ClientAs(user string, groups ...string) (client.Client, error) {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return client.New(cfg, client.Options{Scheme: e.Scheme})
}
