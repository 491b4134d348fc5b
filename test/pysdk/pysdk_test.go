// Package pysdk runs the Python client's pytest suite (clients/python/tests)
// against warmpool on envtest with real agents: the client reaches Sessions
// through kube-apiserver's aggregation layer with a user's kubeconfig, as it
// does on a cluster.
package pysdk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// python returns an interpreter with the client's dependencies (the
// kubernetes client and pytest): $WARMPOOL_PYTHON, which `make test` sets
// after installing them (hack/python-deps.sh), else Debian's python3.
func python(t *testing.T) string {
	py := os.Getenv("WARMPOOL_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import kubernetes, pytest, setuptools, wheel").CombinedOutput()
	if err == nil {
		out, err = exec.Command(py, "-m", "pip", "--version").CombinedOutput()
	}
	if err != nil {
		t.Fatalf("the Python client's tests need %s with the kubernetes client, pytest, pip, setuptools and wheel "+
			"(apt-get install python3-kubernetes python3-pytest python3-pip python3-setuptools python3-wheel, "+
			"as `make test` does through hack/python-deps.sh): %v\n%s", py, err, out)
	}
	return py
}

// install installs the client as a user does (pip, from its pyproject.toml)
// into a directory of its own and returns that directory: the suite then
// tests the package pip built, so a module missing from the package or a
// broken pyproject.toml fails here. The source is copied first because pip
// builds in the source tree. No index: the dependencies are Debian's.
func install(t *testing.T, py string) string {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.CopyFS(src, os.DirFS(filepath.Join(testenv.RepoRoot(), "clients", "python"))); err != nil {
		t.Fatalf("copy the client's source: %v", err)
	}
	target := filepath.Join(t.TempDir(), "site")
	cmd := exec.Command(py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
		"--disable-pip-version-check", "--root-user-action=ignore", "--target", target, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install clients/python: %v\n%s", err, out)
	}
	return target
}

func TestPythonClient(t *testing.T) {
	py := python(t)
	site := install(t, py)
	ctx := context.Background()
	s := stack.ForTest(t)

	ns, err := s.Namespace(ctx, "pysdk-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WarmPool(ctx, ns, "python", 2); err != nil {
		t.Fatal(err)
	}
	editor, err := s.UserKubeconfig(ctx, ns, "sdk-user", "session-editor-role", "execution-editor-role")
	if err != nil {
		t.Fatal(err)
	}
	viewer, err := s.UserKubeconfig(ctx, ns, "sdk-viewer", "session-viewer-role")
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.UserKubeconfig(ctx, ns, "sdk-other", "session-editor-role")
	if err != nil {
		t.Fatal(err)
	}

	args := []string{"-m", "pytest", "-v", "-p", "no:cacheprovider", "clients/python/tests"}
	if f := os.Getenv("WARMPOOL_PYTEST_ARGS"); f != "" {
		args = append(args, strings.Fields(f)...)
	}
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+site,
		"WARMPOOL_TEST_INSTALLED_AT="+site,
		"PYTHONDONTWRITEBYTECODE=1",
		"WARMPOOL_TEST_KUBECONFIG="+editor,
		"WARMPOOL_TEST_KUBECONFIG_VIEWER="+viewer,
		"WARMPOOL_TEST_KUBECONFIG_OTHER="+other,
		"WARMPOOL_TEST_NAMESPACE="+ns,
		"WARMPOOL_TEST_POOL=python",
		// The recovery cases build the scripted data plane with it.
		"GO="+filepath.Join(runtime.GOROOT(), "bin", "go"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("pytest:\n%s", out.String())
	if err != nil {
		t.Fatalf("the Python client's suite failed: %v", err)
	}
}
