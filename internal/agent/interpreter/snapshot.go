package interpreter

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/warmpool/warmpool/pkg/snapshot"
)

// snapshotTimeout bounds saving or loading a namespace before the
// interpreter is interrupted (the values' own pickling code is the user's).
const snapshotTimeout = 5 * time.Minute

// Saved is what the REPL server wrote of the namespace (replserver.py _snapshot).
type Saved struct {
	Python      string              `json:"python"`
	Serializer  string              `json:"serializer"`
	Compression string              `json:"compression"`
	Bytes       int64               `json:"bytes"`
	Variables   []snapshot.Variable `json:"variables"`
	Modules     map[string]string   `json:"modules"`
	Skipped     []snapshot.Skipped  `json:"skipped"`
}

// TooLargeError says the namespace is larger, compressed, than a snapshot may be.
type TooLargeError struct{ Bytes, Limit int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the namespace is more than %d bytes compressed (got to %d): delete large variables (del NAME) "+
		"or keep them in workspace files", e.Limit, e.Bytes)
}

// Snapshot writes the namespace, compressed, to path (a file only the agent
// names), at most limit bytes.
func (it *Interpreter) Snapshot(path string, limit int64) (*Saved, error) {
	if !it.busy.TryLock() {
		return nil, ErrBusy
	}
	defer it.busy.Unlock()
	raw, err := it.call("snapshot", map[string]any{"path": path, "max_bytes": limit}, snapshotTimeout)
	if err != nil {
		return nil, fmt.Errorf("save the namespace: %w", err)
	}
	var s struct {
		Saved
		TooLarge bool  `json:"too_large"`
		Limit    int64 `json:"limit"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("save the namespace: %w", err)
	}
	if s.TooLarge {
		return nil, &TooLargeError{Bytes: s.Bytes, Limit: s.Limit}
	}
	return &s.Saved, nil
}

// Restored is what the REPL server loaded.
type Restored struct {
	Variables int `json:"variables"`
	// ModulesFailed are modules the snapshot imported that this interpreter
	// could not import, with why.
	ModulesFailed map[string]string `json:"modules_failed,omitempty"`
}

// VersionError says a snapshot comes from another Python.
type VersionError struct{ Snapshot, Here string }

func (e *VersionError) Error() string {
	return fmt.Sprintf("the snapshot was made by Python %s and this interpreter is Python %s: a namespace moves only between "+
		"the same major.minor version (its functions carry that version's bytecode)", e.Snapshot, e.Here)
}

// Restore replaces the namespace with the one saved at path.
func (it *Interpreter) Restore(path string, m *snapshot.Manifest) (*Restored, error) {
	if !it.busy.TryLock() {
		return nil, ErrBusy
	}
	defer it.busy.Unlock()
	p, err := it.ensure()
	if err != nil {
		return nil, err
	}
	if here := p.info.Python; here != "" && snapshot.PythonMinor(here) != snapshot.PythonMinor(m.Python) {
		return nil, &VersionError{Snapshot: m.Python, Here: here}
	}
	raw, err := it.call("restore", map[string]any{"path": path, "compression": m.Compression, "modules": m.Modules}, snapshotTimeout)
	if err != nil {
		return nil, fmt.Errorf("load the namespace: %w", err)
	}
	var r Restored
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("load the namespace: %w", err)
	}
	return &r, nil
}
