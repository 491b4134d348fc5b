// Package nodejs runs the TypeScript client's suites for Go tests (test/tssdk
// on envtest, test/e2e on a cluster): node ≥ 20 on PATH, and the package
// packed and installed from its tarball into a project of its own, as a
// user installs it.
package nodejs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warmpool/warmpool/internal/testing/testenv"
)

// T is what the helpers need of a test: testing.TB, or Ginkgo's GinkgoT().
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	TempDir() string
}

// Path returns a PATH with node >= 20 and npm first: $WARMPOOL_NODE_DIR
// (which `make test` sets from hack/node.sh) or the machine's own.
func Path(t T) string {
	path := os.Getenv("PATH")
	if dir := os.Getenv("WARMPOOL_NODE_DIR"); dir != "" {
		path = dir + string(os.PathListSeparator) + path
	}
	cmd := exec.Command("node", "-e", "process.stdout.write(process.versions.node.split('.')[0])")
	cmd.Env = append(os.Environ(), "PATH="+path)
	out, err := cmd.Output()
	major, _ := strconv.Atoi(string(out))
	if err != nil || major < 20 {
		t.Fatalf("the TypeScript client's tests need node >= 20 and npm (hack/node.sh finds or fetches them, as `make test` does): node: %v %s", err, out)
	}
	return path
}

// Run runs a command in dir with path as PATH and fails the test when it fails.
func Run(t T, dir, path string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "PATH="+path, "npm_config_update_notifier=false"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

// Source is the package's directory in the repository.
func Source() string { return filepath.Join(testenv.RepoRoot(), "clients", "typescript") }

// Install packs clients/typescript and installs the tarball into a new
// project, with the package's suites (test/) copied next to it; returns the
// project's directory.
//
// $WARMPOOL_TS_PROJECT names a project made so beforehand, used as it is:
// hack/kind.sh makes one where the npm registry is reachable, and the e2e
// suite runs in the kind node's network namespace, where it is not.
func Install(t T, path string) string {
	if dir := os.Getenv("WARMPOOL_TS_PROJECT"); dir != "" {
		return dir
	}
	src := Source()
	Run(t, src, path, nil, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund")
	packs := t.TempDir()
	out := Run(t, src, path, nil, "npm", "pack", "--silent", "--pack-destination", packs)
	lines := strings.Fields(strings.TrimSpace(out))
	if len(lines) == 0 {
		t.Fatalf("npm pack named no tarball:\n%s", out)
	}
	tarball := filepath.Join(packs, lines[len(lines)-1])

	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"),
		[]byte(`{"name": "tssdk-user", "private": true, "type": "module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Run(t, project, path, nil, "npm", "install", "--prefer-offline", "--no-audit", "--no-fund", tarball)
	if err := os.CopyFS(filepath.Join(project, "test"), os.DirFS(filepath.Join(src, "test"))); err != nil {
		t.Fatalf("copy the suites: %v", err)
	}
	return project
}

// Test runs `node --test` on the project's suites with env added; the
// output is returned whether or not they pass.
func Test(project, path string, env []string, extraArgs ...string) (string, error) {
	args := append([]string{"--test", "--test-reporter=spec", "--test-reporter-destination=stdout"}, extraArgs...)
	args = append(args, "test/")
	cmd := exec.Command("node", args...)
	cmd.Dir = project
	cmd.Env = append(append(os.Environ(), "PATH="+path), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
