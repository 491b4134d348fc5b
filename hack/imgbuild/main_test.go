package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// extract unpacks the image's single layer into dir.
func extract(t *testing.T, path, dir string) {
	t.Helper()
	tag, _ := name.NewTag("warmpool.dev/repl:test")
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			_ = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			target := h.Linkname
			if filepath.IsAbs(target) { // inside the container, / is the image's root
				target = filepath.Join(dir, target)
			}
			_ = os.Symlink(target, p)
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(f, tr)
			_ = f.Close()
		}
	}
}

// The image must hold a python3 that runs on what the image brings alone.
func TestPythonImageIsSelfContained(t *testing.T) {
	python, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("this test needs Debian's python3 (apt-get install python3): %v", err)
	}
	tmp := t.TempDir()
	agent := filepath.Join(tmp, "agent-stand-in")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "repl.tar")
	err = build(options{out: out, tags: []string{"warmpool.dev/repl:test"}, python: python,
		adds: []string{agent + ":/usr/local/bin/agent"}, entrypoint: "/usr/local/bin/agent", cmd: "serve,--listen,:8080",
		user: "65532:65532", workdir: "/workspace"})
	if err != nil {
		t.Fatal(err)
	}

	tag, _ := name.NewTag("warmpool.dev/repl:test")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/usr/local/bin/agent" || cfg.Config.User != "65532:65532" ||
		cfg.Config.WorkingDir != "/workspace" || strings.Join(cfg.Config.Cmd, " ") != "serve --listen :8080" {
		t.Fatalf("config: %+v", cfg.Config)
	}

	root := filepath.Join(tmp, "root")
	extract(t, out, root)
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/agent")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("agent in the image: %v %v", fi, err)
	}
	// Run the image's python with the image's own loader and libraries only.
	var loader string
	for _, l := range []string{"lib64/ld-linux-x86-64.so.2", "lib/ld-linux-aarch64.so.1"} {
		if _, err := os.Stat(filepath.Join(root, l)); err == nil {
			loader = filepath.Join(root, l)
		}
	}
	if loader == "" {
		t.Fatal("no dynamic loader in the image")
	}
	libdirs := []string{}
	for _, d := range []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib"} {
		libdirs = append(libdirs, filepath.Join(root, d))
	}
	cmd := exec.Command(loader, "--library-path", strings.Join(libdirs, ":"), filepath.Join(root, "usr/bin", filepath.Base(python)),
		"-c", `import ast, ctypes, json, re, traceback, linecache, signal, _ctypes
print(sum(json.loads('[40, 2]')))
print(json.__file__)
for w in sorted({w for w in open('/proc/self/maps').read().split() if '.so' in w and w.startswith('/')}):
    print(w)`)
	cmd.Env = []string{"PYTHONHOME=" + filepath.Join(root, "usr")}
	got, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	if err != nil || len(lines) < 3 || lines[0] != "42" {
		t.Fatalf("python from the image: %v\n%s", err, got)
	}
	// The standard library and every shared object it mapped come from the image, not the host.
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, root+"/") {
			t.Errorf("loaded from outside the image: %s", l)
		}
	}
}

// -tool programs run on the libraries the image brings; -symlink links them.
func TestToolsAreSelfContained(t *testing.T) {
	var tools []string
	for _, p := range []string{"/usr/bin/bash", "/usr/bin/rg"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("this test needs %s (apt-get install bash ripgrep): %v", p, err)
		}
		tools = append(tools, p+":"+p)
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "tools.tar")
	if err := build(options{out: out, tags: []string{"warmpool.dev/repl:test"}, tools: tools,
		links: []string{"/bin/bash:/usr/bin/bash"}}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "root")
	extract(t, out, root)
	if target, err := os.Readlink(filepath.Join(root, "bin/bash")); err != nil || target != filepath.Join(root, "usr/bin/bash") {
		t.Fatalf("/bin/bash: %q %v", target, err)
	}
	loader := filepath.Join(root, "lib64/ld-linux-x86-64.so.2")
	if _, err := os.Stat(loader); err != nil {
		t.Fatalf("no dynamic loader in the image: %v", err)
	}
	libs := filepath.Join(root, "lib/x86_64-linux-gnu") + ":" + filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for _, c := range [][]string{{"usr/bin/bash", "-c", "echo $((40 + 2))"}, {"usr/bin/rg", "--version"}} {
		cmd := exec.Command(loader, append([]string{"--library-path", libs, filepath.Join(root, c[0])}, c[1:]...)...)
		cmd.Env = []string{}
		got, err := cmd.CombinedOutput()
		if err != nil || len(got) == 0 {
			t.Errorf("%s from the image: %v\n%s", c[0], err, got)
		}
		if c[0] == "usr/bin/bash" && strings.TrimSpace(string(got)) != "42" {
			t.Errorf("bash from the image printed %q", got)
		}
	}
	// Every shared object bash maps comes from the image, not the host.
	cmd := exec.Command(loader, "--library-path", libs, filepath.Join(root, "usr/bin/bash"), "-c",
		`while read -r _ _ _ _ _ p; do case $p in *.so*) echo "$p";; esac; done < /proc/self/maps`)
	got, err := cmd.CombinedOutput()
	if err != nil || len(got) == 0 {
		t.Fatalf("bash's maps: %v\n%s", err, got)
	}
	for _, l := range strings.Fields(string(got)) {
		if !strings.HasPrefix(l, root+"/") {
			t.Errorf("bash loaded %s from outside the image", l)
		}
	}
}
