// Package workspace gives the agent's file API access to one directory and
// nothing outside it, symlinks included (os.Root).
package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// ErrEscape is returned for a path outside the workspace.
var ErrEscape = errors.New("path escapes the workspace")

// Workspace is a directory the code and the file API share.
type Workspace struct {
	dir  string
	root *os.Root
}

// Open opens dir (creating it) as a workspace.
func Open(dir string) (*Workspace, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create workspace %s: %w", dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", dir, err)
	}
	return &Workspace{dir: dir, root: root}, nil
}

// Dir is the workspace's directory.
func (w *Workspace) Dir() string { return w.dir }

// clean turns a user path ("/a/b", "a/b", "") into a local one, refusing escapes.
func clean(p string) (string, error) {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return ".", nil
	}
	p = path.Clean(p)
	if !filepath.IsLocal(p) {
		return "", fmt.Errorf("%w: %q", ErrEscape, p)
	}
	return p, nil
}

func wrap(err error) error {
	if err != nil && strings.Contains(err.Error(), "escapes from parent") {
		return fmt.Errorf("%w: %v", ErrEscape, err)
	}
	return err
}

// ErrNotRegular is returned for a path that is a FIFO, a socket or a
// device: reading or writing one could wait forever for the code at its other end.
var ErrNotRegular = errors.New("not a regular file")

// Read opens a regular file (or a directory) for reading. It never waits for
// the code: a FIFO is opened without blocking and refused.
func (w *Workspace) Read(p string) (*os.File, error) {
	c, err := clean(p)
	if err != nil {
		return nil, err
	}
	f, err := w.root.OpenFile(c, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, wrap(err)
	}
	if err := regularOrDir(f, c); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func regularOrDir(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return fmt.Errorf("%w: %q is a %s", ErrNotRegular, "/"+strings.TrimPrefix(path, "."), kind(fi.Mode()))
	}
	return nil
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// Write writes a file, creating its parent directories, with at most limit bytes.
func (w *Workspace) Write(p string, r io.Reader, limit int64) (int64, error) {
	c, err := clean(p)
	if err != nil {
		return 0, err
	}
	if c == "." {
		return 0, errors.New("path is required")
	}
	if dir := path.Dir(c); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return 0, wrap(err)
		}
	}
	// Without blocking: a FIFO the code made there would hold the write until
	// someone read it (ENXIO without a reader; refused below with one).
	f, err := w.root.OpenFile(c, os.O_CREATE|os.O_WRONLY|syscall.O_NONBLOCK, 0o644)
	if errors.Is(err, syscall.ENXIO) {
		return 0, fmt.Errorf("%w: %q is a FIFO", ErrNotRegular, "/"+c)
	}
	if err != nil {
		return 0, wrap(err)
	}
	if err := regularOrDir(f, c); err != nil {
		_ = f.Close()
		return 0, err
	}
	if err := f.Truncate(0); err != nil {
		_ = f.Close()
		return 0, err
	}
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > limit {
		_ = w.root.Remove(c)
		return 0, fmt.Errorf("file larger than the limit of %d bytes", limit)
	}
	return n, err
}

// Stat describes one path.
func (w *Workspace) Stat(p string) (*protocol.FileInfo, error) {
	c, err := clean(p)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Stat(c)
	if err != nil {
		return nil, wrap(err)
	}
	return info(c, fi), nil
}

// List describes the entries of a directory.
func (w *Workspace) List(p string) ([]protocol.FileInfo, error) {
	c, err := clean(p)
	if err != nil {
		return nil, err
	}
	f, err := w.root.Open(c)
	if err != nil {
		return nil, wrap(err)
	}
	defer func() { _ = f.Close() }()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	out := make([]protocol.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, *info(path.Join(c, e.Name()), fi))
	}
	return out, nil
}

func info(p string, fi fs.FileInfo) *protocol.FileInfo {
	return &protocol.FileInfo{Path: "/" + strings.TrimPrefix(p, "."), Name: fi.Name(), Size: fi.Size(),
		Dir: fi.IsDir(), Mode: fi.Mode().String(), ModTime: fi.ModTime()}
}
