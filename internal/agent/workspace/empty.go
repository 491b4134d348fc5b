package workspace

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Empty removes everything inside dir, and keeps dir. Directories the code
// made unwritable or unreadable (its own, so the agent's too) are made
// accessible first; symbolic links are removed, never followed.
func Empty(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		// A walk cannot descend into a directory it could not read before
		// its chmod: each pass opens one more level of what the code locked.
		var err error
		for i := 0; i < 16; i++ {
			if err = os.RemoveAll(p); err == nil {
				break
			}
			_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, _ error) error {
				if d != nil && d.IsDir() {
					_ = os.Chmod(q, 0o700)
				}
				return nil
			})
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
