// Command imgbuild writes container image tarballs without Docker: an empty
// base, one layer of files taken from this machine, and an image config. The
// output is a docker-archive that `ctr images import` and
// `kind load image-archive` accept.
//
//	go run ./hack/imgbuild -o dist/repl.tar -tag warmpool.dev/repl:dev \
//	    -python /usr/bin/python3.11 -add bin/agent:/usr/local/bin/agent \
//	    -entrypoint /usr/local/bin/agent -user 65532:65532 -workdir /workspace
//
// With -python, the interpreter, its standard library (Debian's
// /usr/lib/python3.X), the shared libraries they link (found with ldd) and
// the dynamic loader go into the image, so python3 runs with no distribution
// underneath. -python-packages adds a tree of Python packages (numpy...), or
// the data they read (matplotlib's mpl-data), the same way; it may be given
// more than once.
//
// -tool SRC:DEST adds a program with the shared libraries it links (bash,
// ripgrep), -symlink DEST:TARGET a link (busybox's applets).
//
// With -base, a root file system tarball (a debootstrapped Debian, say) is the
// image's first layer and the files above go into a second one: the kind
// node's kube-proxy and kube-router need iptables and ipset with everything
// they load. -tag may be given more than once to name one image several ways.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var opts options
	var adds, tags, tools, links, packages listFlag
	flag.StringVar(&opts.out, "o", "", "output tarball")
	flag.Var(&tags, "tag", "image name:tag (repeatable)")
	flag.StringVar(&opts.base, "base", "", "root file system tarball to use as the first layer")
	flag.StringVar(&opts.python, "python", "", "python interpreter to include, e.g. /usr/bin/python3.11")
	flag.Var(&packages, "python-packages", "a directory of Python packages (or their data) to include with the libraries its .so files link, e.g. /usr/lib/python3/dist-packages/numpy (repeatable)")
	flag.Var(&adds, "add", "SRC:DEST file to add (repeatable)")
	flag.Var(&tools, "tool", "SRC:DEST program to add with the shared libraries it links (repeatable)")
	flag.Var(&links, "symlink", "DEST:TARGET symbolic link to add (repeatable)")
	flag.StringVar(&opts.entrypoint, "entrypoint", "", "entrypoint, comma-separated")
	flag.StringVar(&opts.cmd, "cmd", "", "default arguments, comma-separated")
	flag.StringVar(&opts.user, "user", "", "user[:group] the container runs as")
	flag.StringVar(&opts.workdir, "workdir", "", "working directory")
	flag.Parse()
	opts.adds, opts.tags, opts.tools, opts.links, opts.pythonPackages = adds, tags, tools, links, packages
	if opts.out == "" || len(opts.tags) == 0 {
		fmt.Fprintln(os.Stderr, "imgbuild: -o and -tag are required")
		os.Exit(2)
	}
	if err := build(opts); err != nil {
		fmt.Fprintln(os.Stderr, "imgbuild:", err)
		os.Exit(1)
	}
}

type options struct {
	out, base, python                        string
	adds, tags, tools, links, pythonPackages []string
	entrypoint, cmd, user, workdir           string
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func build(o options) error {
	refs := make([]name.Reference, 0, len(o.tags))
	for _, t := range o.tags {
		ref, err := name.ParseReference(t)
		if err != nil {
			return fmt.Errorf("tag %q: %w", t, err)
		}
		refs = append(refs, ref)
	}
	files := newFileSet()
	for _, a := range o.adds {
		src, dest, ok := strings.Cut(a, ":")
		if !ok {
			return fmt.Errorf("-add %q: want SRC:DEST", a)
		}
		files.add(src, dest)
	}
	if o.python != "" {
		if err := addPython(files, o.python, o.pythonPackages); err != nil {
			return err
		}
	}
	if err := addTools(files, o.tools); err != nil {
		return err
	}
	for _, l := range o.links {
		dest, target, ok := strings.Cut(l, ":")
		if !ok {
			return fmt.Errorf("-symlink %q: want DEST:TARGET", l)
		}
		files.symlink(dest, target)
	}
	for _, d := range []string{"/tmp", o.workdir} {
		if d != "" {
			files.dir(d, 0o1777)
		}
	}
	if o.user != "" {
		uid, gid, _ := strings.Cut(o.user, ":")
		if gid == "" {
			gid = uid
		}
		files.content("/etc/passwd", fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nsandbox:x:%s:%s:sandbox:/workspace:/sbin/nologin\n", uid, gid))
		files.content("/etc/group", fmt.Sprintf("root:x:0:\nsandbox:x:%s:\n", gid))
	}

	layerFile, err := os.CreateTemp("", "imgbuild-layer-*.tar")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(layerFile.Name()) }()
	if err := files.writeTar(layerFile); err != nil {
		return err
	}
	if err := layerFile.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromFile(layerFile.Name())
	if err != nil {
		return err
	}
	var layers []v1.Layer
	if o.base != "" {
		base, err := tarball.LayerFromFile(o.base)
		if err != nil {
			return fmt.Errorf("base %s: %w", o.base, err)
		}
		layers = append(layers, base)
	}
	img, err := mutate.AppendLayers(empty.Image, append(layers, layer)...)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config = v1.Config{
		Entrypoint: split(o.entrypoint), Cmd: split(o.cmd), User: o.user, WorkingDir: o.workdir,
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	named := make(map[name.Reference]v1.Image, len(refs))
	for _, ref := range refs {
		named[ref] = img
	}
	if err := tarball.MultiRefWriteToFile(o.out, named); err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	fmt.Printf("wrote %s (%s, %d files)\n", o.out, strings.Join(o.tags, ", "), len(files.entries))
	return nil
}

// addPython adds the interpreter, its standard library and what they link.
func addPython(files *fileSet, python string, packages []string) error {
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return fmt.Errorf("python %s: %w", python, err)
	}
	base := filepath.Base(real) // python3.11
	if !regexp.MustCompile(`^python3\.\d+$`).MatchString(base) {
		return fmt.Errorf("python %s resolves to %s: want a python3.X binary", python, real)
	}
	files.add(real, "/usr/bin/"+base)
	files.symlink("/usr/bin/python3", base)
	binaries := []string{real}
	trees := append([]string{"/usr/lib/" + base}, packages...)
	for _, tree := range trees {
		err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				switch d.Name() {
				case "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "__pycache__":
					return filepath.SkipDir
				}
				if strings.HasPrefix(d.Name(), "config-3.") { // python3-dev's static libpython and build files
					return filepath.SkipDir
				}
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 { // kept a link (zoneinfo's posix -> .)
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				files.symlink(p, target)
				return nil
			}
			files.add(p, p)
			if strings.HasSuffix(p, ".so") || strings.Contains(p, ".so.") {
				binaries = append(binaries, p)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("walk %s: %w", tree, err)
		}
	}
	return addLibraries(files, binaries)
}

// addTools adds programs (SRC:DEST) and the libraries they link.
func addTools(files *fileSet, tools []string) error {
	var binaries []string
	for _, t := range tools {
		src, dest, ok := strings.Cut(t, ":")
		if !ok {
			return fmt.Errorf("-tool %q: want SRC:DEST", t)
		}
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return fmt.Errorf("tool %s: %w", src, err)
		}
		files.add(real, dest)
		binaries = append(binaries, real)
	}
	return addLibraries(files, binaries)
}

// addLibraries adds the shared libraries the binaries load.
func addLibraries(files *fileSet, binaries []string) error {
	libs, err := sharedLibraries(binaries)
	if err != nil {
		return err
	}
	for _, l := range libs {
		files.add(l, l)
	}
	return nil
}

var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x`)

// sharedLibraries lists, with ldd, the libraries the binaries load, the loader included.
func sharedLibraries(binaries []string) ([]string, error) {
	seen := map[string]bool{}
	for _, b := range binaries {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) { // "not a dynamic executable"
				continue
			}
			return nil, fmt.Errorf("ldd %s: %w (install libc-bin)", b, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if m := lddLine.FindStringSubmatch(sc.Text()); m != nil {
				seen[m[1]] = true
			}
		}
	}
	var out []string
	for l := range seen {
		out = append(out, l)
	}
	sort.Strings(out)
	return out, nil
}

type entry struct {
	src     string // file on this machine, or "" for content/dir/symlink
	content []byte
	link    string
	mode    int64
	dir     bool
}

type fileSet struct{ entries map[string]entry }

func newFileSet() *fileSet { return &fileSet{entries: map[string]entry{}} }

// add adds a file; a symlinked source keeps its link, and the target is added too.
func (f *fileSet) add(src, dest string) {
	if fi, err := os.Lstat(src); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(src)
		f.symlink(dest, target)
		if filepath.IsAbs(target) {
			f.add(target, target)
		} else {
			f.add(filepath.Join(filepath.Dir(src), target), filepath.Join(filepath.Dir(dest), target))
		}
		return
	}
	f.entries[filepath.Clean(dest)] = entry{src: src}
}

func (f *fileSet) symlink(dest, target string) { f.entries[filepath.Clean(dest)] = entry{link: target} }
func (f *fileSet) content(dest, s string)      { f.entries[dest] = entry{content: []byte(s), mode: 0o644} }
func (f *fileSet) dir(dest string, mode int64) { f.entries[dest] = entry{dir: true, mode: mode} }

// writeTar writes the layer: parent directories first, in a stable order.
func (f *fileSet) writeTar(w io.Writer) error {
	dirs := map[string]bool{}
	for p := range f.entries {
		for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		if _, ok := f.entries[d]; !ok {
			f.entries[d] = entry{dir: true, mode: 0o755}
		}
	}
	for p := range f.entries {
		names = append(names, p)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, p := range names {
		e := f.entries[p]
		name := strings.TrimPrefix(p, "/")
		switch {
		case e.dir:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: e.mode}); err != nil {
				return err
			}
		case e.link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.link, Mode: 0o777}); err != nil {
				return err
			}
		case e.content != nil:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: e.mode, Size: int64(len(e.content))}); err != nil {
				return err
			}
			if _, err := tw.Write(e.content); err != nil {
				return err
			}
		default:
			if err := copyFile(tw, name, e.src); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyFile(tw *tar.Writer, name, src string) error {
	fh, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("add %s: %w", src, err)
	}
	defer func() { _ = fh.Close() }()
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(fi.Mode().Perm()), Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, fh)
	return err
}
