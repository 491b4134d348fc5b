package workspace

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
)

func TestChangesListCreatedAndChangedFilesOnly(t *testing.T) {
	w, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	write := func(p, data string) {
		t.Helper()
		full := filepath.Join(w.Dir(), p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("same.txt", "same")
	write("edited.txt", "v1")
	write("gone.txt", "x")
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{"same.txt", "edited.txt", "gone.txt"} {
		_ = os.Chtimes(filepath.Join(w.Dir(), p), old, old)
	}
	before := w.Snapshot()
	write("edited.txt", "v2")
	write("new/deep/file.bin", "12345")
	_ = os.Remove(filepath.Join(w.Dir(), "gone.txt"))
	got := Changes(before, w.Snapshot())
	want := []protocol.FileChange{{Path: "edited.txt", Size: 2}, {Path: "new/deep/file.bin", Size: 5, Created: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("changes = %+v, want %+v", got, want)
	}
}

func TestChangesOfATooLargeWorkspaceAreNotListed(t *testing.T) {
	w, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	before := w.Snapshot()
	for i := 0; i <= maxSnapshotEntries; i++ {
		if err := os.WriteFile(filepath.Join(w.Dir(), fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := Changes(before, w.Snapshot()); got != nil {
		t.Fatalf("%d changes listed for a workspace past the walk's bound", len(got))
	}
}
