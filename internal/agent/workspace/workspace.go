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

// Read opens a file for reading.
func (w *Workspace) Read(p string) (*os.File, error) {
	c, err := clean(p)
	if err != nil {
		return nil, err
	}
	f, err := w.root.Open(c)
	return f, wrap(err)
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
	f, err := w.root.OpenFile(c, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, wrap(err)
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
