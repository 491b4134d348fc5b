package stack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// ForTest starts a Stack for a Go test whose manager logs to a file, stopped
// when the test ends; a failed test ends with the tail of that log.
func ForTest(t testing.TB) *Stack {
	t.Helper()
	logFile, err := os.Create(filepath.Join(t.TempDir(), "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Options{Log: zap.New(zap.WriteTo(logFile), zap.UseDevMode(true))})
	if err != nil {
		t.Fatalf("start warmpool on envtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			tail(t, logFile.Name(), 150)
		}
		s.Stop()
	})
	return s
}

func tail(t testing.TB, path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("last %d lines of the manager's log:\n%s", len(lines), strings.Join(lines, "\n"))
}
