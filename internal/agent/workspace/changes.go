package workspace

import (
	"io/fs"
	"path/filepath"
	"sort"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// maxSnapshotEntries bounds the walk of a snapshot: a workspace with more
// entries lists no changes rather than slowing every run down.
const maxSnapshotEntries = 5000

type fileState struct {
	size    int64
	modTime int64
}

// Snapshot is the files of the workspace at one moment, for Changes.
type Snapshot struct {
	files    map[string]fileState
	complete bool
}

// Snapshot records the workspace's regular files (size and modification
// time), or says it is too large to follow.
func (w *Workspace) Snapshot() Snapshot {
	s := Snapshot{files: map[string]fileState{}, complete: true}
	entries := 0
	_ = filepath.WalkDir(w.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a directory it may not read: what it holds is not followed
		}
		if entries++; entries > maxSnapshotEntries {
			s.complete = false
			return filepath.SkipAll
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		rel, err := filepath.Rel(w.dir, p)
		if err == nil {
			s.files[filepath.ToSlash(rel)] = fileState{size: info.Size(), modTime: info.ModTime().UnixNano()}
		}
		return nil
	})
	return s
}

// Changes lists the files created or changed between two snapshots, by
// path, at most protocol.MaxFileChanges; nil when either snapshot was too
// large to follow.
func Changes(before, after Snapshot) []protocol.FileChange {
	if !before.complete || !after.complete {
		return nil
	}
	var out []protocol.FileChange
	for p, st := range after.files {
		old, existed := before.files[p]
		if !existed || old != st {
			out = append(out, protocol.FileChange{Path: p, Size: st.size, Created: !existed})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	if len(out) > protocol.MaxFileChanges {
		out = out[:protocol.MaxFileChanges]
	}
	return out
}
