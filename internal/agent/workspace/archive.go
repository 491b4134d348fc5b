package workspace

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"
)

// ErrTooLarge is returned when the workspace holds more than an archive may.
var ErrTooLarge = errors.New("the workspace is larger than the snapshot's limit")

// Archive writes the workspace's directories and regular files to w as a
// tar, refusing more than limit bytes of file content. Symlinks, devices and
// sockets are left out and counted in skipped: restored elsewhere, a link
// could point anywhere.
func (w *Workspace) Archive(out io.Writer, limit int64) (files int, size int64, skipped int, err error) {
	tw := tar.NewWriter(out)
	err = fs.WalkDir(w.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("read %s in the workspace: %w", p, err)
		}
		if p == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("stat %s in the workspace: %w", p, err)
		}
		switch {
		case d.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()})
		case !d.Type().IsRegular():
			skipped++
			return nil
		}
		if size += info.Size(); size > limit {
			return fmt.Errorf("%w: more than %d bytes of files (at %s)", ErrTooLarge, limit, p)
		}
		f, err := w.root.Open(p)
		if err != nil {
			return fmt.Errorf("open %s in the workspace: %w", p, err)
		}
		defer func() { _ = f.Close() }()
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Size: info.Size(), Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()}); err != nil {
			return err
		}
		// A file that grows while it is read is cut at the size in its header.
		if _, err := io.CopyN(tw, f, info.Size()); err != nil {
			return fmt.Errorf("read %s in the workspace: %w", p, err)
		}
		files++
		return nil
	})
	if err != nil {
		return files, size, skipped, err
	}
	return files, size, skipped, tw.Close()
}

// Extract writes a tar made by Archive into the workspace, through the
// workspace's root so that no name, however made, lands outside it; only
// directories and regular files are taken, at most limit bytes in all.
func (w *Workspace) Extract(r io.Reader, limit int64) (files int, err error) {
	tr := tar.NewReader(r)
	var size int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, fmt.Errorf("read the snapshot's workspace: %w", err)
		}
		name := path.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return files, fmt.Errorf("%w: %q in the snapshot's workspace", ErrEscape, h.Name)
		}
		mode := os.FileMode(h.Mode).Perm() | 0o600 // the agent and the code must be able to read it back
		switch h.Typeflag {
		case tar.TypeDir:
			if err := w.root.MkdirAll(name, mode|0o700); err != nil {
				return files, wrap(err)
			}
		case tar.TypeReg:
			if size += h.Size; size > limit {
				return files, fmt.Errorf("%w: more than %d bytes of files", ErrTooLarge, limit)
			}
			if dir := path.Dir(name); dir != "." {
				if err := w.root.MkdirAll(dir, 0o755); err != nil {
					return files, wrap(err)
				}
			}
			f, err := w.root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return files, wrap(err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return files, fmt.Errorf("write %s in the workspace: %w", name, err)
			}
			if !h.ModTime.IsZero() {
				_ = w.root.Chtimes(name, time.Now(), h.ModTime)
			}
			files++
		default:
			return files, fmt.Errorf("the snapshot's workspace holds %q of a type that is not restored (only files and directories)", h.Name)
		}
	}
}
