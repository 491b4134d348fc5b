//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/tools/clientcmd"
)

// README.md runs as written: every sh, python and js block, in order, on the
// local cluster, as a new user following it from a fresh shell would, in a
// clean checkout of the commit under test (a git worktree). A block that
// cannot run here says why in a comment just above it:
//
//	<!-- readme-test
//	skip: why (the suite's own setup does this; it would end the suite...)
//	before: shell run first, unseen (inputs the reader is assumed to have)
//	prelude: python run first, unseen (a model client of the reader's own)
//	serve: 127.0.0.1:8080 (a server: it must come to accept connections there, within 5 minutes)
//	cwd: ~/dir (js: the directory it runs in, where README installed the package it imports)
//	-->
//
// Shell blocks share one shell's state: what a block exports, the next sees.
// Python blocks run in that shell with the venv README's install block makes;
// js blocks as ES modules with that shell's node.

// readmeBlock is one fenced block of README.md and its directives.
type readmeBlock struct {
	lang, code   string
	line         int
	skip, before string
	prelude      string
	serve        string // the address a server the block starts listens on
	cwd          string // js: where it runs (bare imports resolve from there)
}

func readmeBlocks(path string) ([]readmeBlock, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var (
		blocks     []readmeBlock
		cur        *readmeBlock
		directives map[string]string
		inComment  bool
		lastKey    string
	)
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case inComment:
			if strings.TrimSpace(line) == "-->" {
				inComment = false
				continue
			}
			if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
				lastKey = strings.TrimSpace(k)
				directives[lastKey] = strings.TrimSpace(v)
			} else if lastKey != "" { // a continuation line of the last directive
				directives[lastKey] += "\n" + strings.TrimPrefix(line, "  ")
			}
		case strings.TrimSpace(line) == "<!-- readme-test":
			inComment, directives, lastKey = true, map[string]string{}, ""
		case strings.HasPrefix(line, "```"):
			lang := strings.TrimSpace(strings.TrimPrefix(line, "```"))
			if lang != "sh" && lang != "bash" && lang != "python" && lang != "js" {
				// Go, YAML and the rest are read, not run: skip to their end.
				for sc.Scan() {
					n++
					if strings.HasPrefix(sc.Text(), "```") {
						break
					}
				}
				directives = nil
				continue
			}
			cur = &readmeBlock{lang: lang, line: n}
			if directives != nil {
				cur.skip, cur.before, cur.prelude = directives["skip"], directives["before"], directives["prelude"]
				cur.serve, cur.cwd = directives["serve"], directives["cwd"]
			}
			directives = nil
		case strings.TrimSpace(line) != "" && directives != nil && !strings.HasPrefix(line, "<!--"):
			// Directives belong to the block right below them, and to no other.
			directives = nil
		}
	}
	return blocks, sc.Err()
}

var _ = Describe("README.md", Ordered, Label("readme"), func() {
	var (
		dir, state, venv string
		env              []string
	)

	BeforeAll(func() {
		// The commands of README address the local cluster by name
		// (hack/local-cluster.sh kubeconfig), as a reader on this machine does.
		local := strings.TrimSpace(run(filepath.Join(repoRoot(), "hack", "local-cluster.sh"), "kubeconfig"))
		cfg, err := clientcmd.BuildConfigFromFlags("", local)
		if err != nil || cfg.Host != restConfig.Host {
			Skip("README's commands address the local cluster (hack/local-cluster.sh kubeconfig); this suite runs on " + restConfig.Host)
		}
		dir = filepath.Join(GinkgoT().TempDir(), "checkout")
		run("git", "-C", repoRoot(), "worktree", "add", "--detach", dir, "HEAD")
		DeferCleanup(func() {
			_, _ = exec.Command("git", "-C", repoRoot(), "worktree", "remove", "--force", dir).CombinedOutput()
		})
		state = filepath.Join(GinkgoT().TempDir(), "shell-state")
		Expect(os.WriteFile(state, nil, 0o600)).To(Succeed())
		// README's ~ (the agent daemon's socket, the venv, the TypeScript
		// project) is a home of the test's own: no test writes to the real
		// one. The build caches stay the real ones, so nothing is built twice.
		realHome, _ := os.UserHomeDir()
		home := filepath.Join(GinkgoT().TempDir(), "home")
		Expect(os.MkdirAll(home, 0o700)).To(Succeed())
		venv = filepath.Join(home, ".venvs", "warmpool")
		cacheHome := os.Getenv("XDG_CACHE_HOME")
		if cacheHome == "" {
			cacheHome = filepath.Join(realHome, ".cache")
		}
		// A fresh shell: the reader's PATH has no kubectl of its own (README
		// says how to put the cached one on it); KUBECONFIG is unset.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "KUBECONFIG=") && !strings.HasPrefix(kv, "KUBECTL=") && !strings.HasPrefix(kv, "HOME=") {
				env = append(env, kv)
			}
		}
		env = append(env, "HOME="+home, "XDG_CACHE_HOME="+cacheHome, "npm_config_cache="+filepath.Join(realHome, ".npm"))
		for _, name := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
			if os.Getenv(name) == "" {
				env = append(env, name+"="+strings.TrimSpace(run("go", "env", name)))
			}
		}
		DeferCleanup(cleanReadmeObjects)
	})

	blocks, err := readmeBlocks(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		panic(err)
	}
	for _, b := range blocks {
		first, _, _ := strings.Cut(strings.TrimSpace(b.code), "\n")
		It(fmt.Sprintf("line %d (%s): %s", b.line, b.lang, first), func() {
			if b.skip != "" {
				Skip("README.md:" + fmt.Sprint(b.line) + ": " + b.skip)
			}
			var cmd *exec.Cmd
			switch b.lang {
			case "python":
				// In the shell the blocks before left: its KUBECONFIG and PATH.
				file := filepath.Join(GinkgoT().TempDir(), "block.py")
				Expect(os.WriteFile(file, []byte(b.prelude+"\n"+b.code), 0o600)).To(Succeed())
				cmd = exec.Command("bash", "-c", "source "+state+"\nexec "+filepath.Join(venv, "bin", "python")+" "+file)
			case "js":
				// An ES module read from stdin resolves bare imports from the
				// working directory: the package README installed there.
				file := filepath.Join(GinkgoT().TempDir(), "block.mjs")
				Expect(os.WriteFile(file, []byte(b.code), 0o600)).To(Succeed())
				cwd := b.cwd
				if cwd == "" {
					cwd = "."
				}
				cmd = exec.Command("bash", "-c", "source "+state+"\ncd "+cwd+" && exec node --input-type=module < "+file)
			default:
				script := "set -eo pipefail\nsource " + state + "\n" + b.before + "\n" + b.code + "\nexport -p > " + state + "\n"
				cmd = exec.Command("bash", "-c", script)
			}
			cmd.Dir, cmd.Env = dir, env
			// Its own process group: what a block leaves running in the
			// background (a daemon, a server) ends with it.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			// A file, not a pipe: a daemon the block leaves in the background
			// keeps its stdout open, and Wait would wait for it.
			out := &outputFile{name: filepath.Join(GinkgoT().TempDir(), "output")}
			f, err := os.Create(out.name)
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = f.Close() }()
			cmd.Stdout, cmd.Stderr = f, f
			Expect(cmd.Start()).To(Succeed())
			defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			if b.serve != "" {
				// A server runs until stopped: it passes once it answers.
				Eventually(func(g Gomega) {
					select {
					case err := <-done:
						Fail(fmt.Sprintf("README.md:%d: the server ended (%v) before it listened on %s:\n%s", b.line, err, b.serve, out.String()))
					default:
					}
					c, err := net.DialTimeout("tcp", b.serve, time.Second)
					g.Expect(err).NotTo(HaveOccurred())
					_ = c.Close()
				}).WithTimeout(5*time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "README.md:%d:\n%s", b.line, out.String())
			} else {
				select {
				case err := <-done:
					Expect(err).NotTo(HaveOccurred(), "README.md:%d, as written:\n%s\noutput:\n%s", b.line, b.code, out.String())
				case <-time.After(20 * time.Minute):
					Fail(fmt.Sprintf("README.md:%d ran longer than 20 minutes:\n%s", b.line, out.String()))
				}
			}
			fmt.Fprintf(GinkgoWriter, "README.md:%d output:\n%s\n", b.line, out.String())
		})
	}
})

// cleanReadmeObjects deletes what README's blocks made in the default
// namespace and the cluster, so that the suite leaves the cluster as it
// found it.
func cleanReadmeObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"delete", "executions,sessions", "--all", "-n", "default", "--ignore-not-found", "--wait=false"},
		{"delete", "-f", filepath.Join(repoRoot(), "config", "samples", "llm", "modelendpoint.yaml"), "--ignore-not-found", "--wait=false"},
		{"delete", "sandboxpools", "--all", "-n", "default", "--ignore-not-found", "--wait=false"},
		{"-n", "warmpool-system", "delete", "secret", "openai", "--ignore-not-found"},
		{"label", "ns", "default", "warmpool.dev/llm-"},
	} {
		_, _ = exec.CommandContext(ctx, kubectl(), args...).CombinedOutput()
	}
}

// outputFile is what a block printed, read while it may still print.
type outputFile struct{ name string }

func (o *outputFile) String() string {
	data, _ := os.ReadFile(o.name)
	return string(data)
}
