package server

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

func takeSnapshot(t *testing.T, a *agent, o client.SnapshotOptions) []byte {
	t.Helper()
	body, size, err := a.c.Snapshot(context.Background(), o)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	defer func() { _ = body.Close() }()
	b, err := io.ReadAll(body)
	if err != nil || int64(len(b)) != size {
		t.Fatalf("snapshot body: %d of %d bytes, %v", len(b), size, err)
	}
	return b
}

func result(t *testing.T, a *agent, code string) string {
	t.Helper()
	res, err := a.c.Execute(context.Background(), protocol.ExecuteRequest{Code: code})
	if err != nil || res.Status != protocol.StatusSucceeded {
		t.Fatalf("%q: %+v %v", code, res, err)
	}
	if res.Result == nil {
		return ""
	}
	return *res.Result
}

// A snapshot carries the namespace (values, functions and classes made in
// the REPL, which keep reading the live namespace once restored), the
// workspace's files, and names what it could not keep instead of dropping it
// silently; another interpreter restores it.
func TestSnapshotMovesTheNamespaceToAnotherInterpreter(t *testing.T) {
	src, dst := startAgent(t, 1), startAgent(t, 1)
	result(t, src, `
import json as j, socket
x = 41
data = {"a": [1, 2, 3]}
def f(): return x + 1
class C:
    def m(self): return f() * 2
c = C()
shared = [data, data]
sock = socket.socket()
gen = (i for i in range(3))
open("notes.txt", "w").write("kept")
True`)
	snap := takeSnapshot(t, src, client.SnapshotOptions{Workspace: true})

	m, err := snapshot.ReadHeader(bytes.NewReader(snap))
	if err != nil || m.Validate(0) != nil {
		t.Fatalf("manifest: %+v %v", m, err)
	}
	names := map[string]string{}
	for _, v := range m.Variables {
		names[v.Name] = v.Type
	}
	if names["x"] != "int" || names["f"] != "function" || names["C"] != "type" || names["c"] != "C" {
		t.Errorf("variables in the manifest: %v", names)
	}
	skipped := map[string]string{}
	for _, s := range m.Skipped {
		skipped[s.Name] = s.Reason
	}
	if !strings.Contains(skipped["sock"], "socket") || !strings.Contains(skipped["gen"], "generator") || len(skipped) != 2 {
		t.Errorf("skipped: %v, want sock and gen with their reasons", m.Skipped)
	}
	if m.Modules["j"] != "json" || m.Workspace == nil || m.Workspace.Files != 1 {
		t.Errorf("modules %v, workspace %+v", m.Modules, m.Workspace)
	}

	got, err := dst.c.Restore(context.Background(), bytes.NewReader(snap), client.RestoreOptions{})
	if err != nil || got.WorkspaceFiles != 1 {
		t.Fatalf("restore: %+v %v", got, err)
	}
	// The function reads the restored namespace, not a copy of it.
	result(t, dst, "x = 100")
	if r := result(t, dst, "(f(), c.m(), shared[0] is shared[1], j.dumps(data), 'sock' in globals(), open('notes.txt').read())"); r != `(101, 202, True, '{"a": [1, 2, 3]}', False, 'kept')` {
		t.Errorf("restored namespace: %s", r)
	}
	// The source goes on unchanged.
	if r := result(t, src, "f()"); r != "42" {
		t.Errorf("source after the snapshot: %s", r)
	}
}

// A sealing snapshot (a suspend) takes the last state: nothing runs or
// writes afterwards, with a reason a caller can act on, until unsealed.
func TestSealRefusesChangesUntilUnsealed(t *testing.T) {
	a := startAgent(t, 1)
	ctx := context.Background()
	result(t, a, "x = 1")
	takeSnapshot(t, a, client.SnapshotOptions{Seal: true})
	_, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "x = 2"})
	if !client.IsSealed(err) || !client.IsStatus(err, http.StatusConflict) {
		t.Fatalf("run after a seal: %v, want 409 Sealed", err)
	}
	if _, err := a.c.Shell(ctx, protocol.ShellRequest{Command: "touch x"}); !client.IsSealed(err) {
		t.Errorf("shell after a seal: %v", err)
	}
	code, msg := raw(t, "PUT", a.url+protocol.PathFileWrite+"?path=f", "Bearer "+token, "data")
	if code != http.StatusConflict || !strings.Contains(msg, "sealed") {
		t.Errorf("file write after a seal: %d %s", code, msg)
	}
	if h, err := a.c.Ready(ctx); err != nil || !h.Sealed {
		t.Errorf("readyz after a seal: %+v %v", h, err)
	}
	// A second sealing snapshot (a suspend retried after a crash) is allowed.
	takeSnapshot(t, a, client.SnapshotOptions{Seal: true})
	if err := a.c.Unseal(ctx); err != nil {
		t.Fatal(err)
	}
	if r := result(t, a, "x + 1"); r != "2" {
		t.Errorf("after unseal: %s", r)
	}
}

// Bytes that are not what their manifest says are refused before anything
// is unpickled; limits and a foreign Python give clear errors.
func TestRestoreRefusesBadSnapshots(t *testing.T) {
	src, dst := startAgent(t, 1), startAgent(t, 1)
	ctx := context.Background()
	result(t, src, "big = 'y' * 100000\nsmall = 1")
	snap := takeSnapshot(t, src, client.SnapshotOptions{})
	result(t, dst, "mine = 'still here'")

	torn := bytes.Clone(snap)
	torn[len(torn)-3] ^= 0xff
	for name, body := range map[string][]byte{
		"altered":   torn,
		"truncated": snap[:len(snap)-10],
		"garbage":   []byte("not a snapshot at all"),
	} {
		_, err := dst.c.Restore(ctx, bytes.NewReader(body), client.RestoreOptions{})
		if !client.IsStatus(err, http.StatusBadRequest) {
			t.Errorf("%s snapshot: %v, want 400", name, err)
		}
	}
	if r := result(t, dst, "mine"); r != "'still here'" {
		t.Errorf("a refused restore changed the namespace: %s", r)
	}

	_, _, err := src.c.Snapshot(ctx, client.SnapshotOptions{MaxBytes: 50})
	if !client.IsStatus(err, http.StatusRequestEntityTooLarge) || !strings.Contains(err.Error(), "del NAME") {
		t.Errorf("snapshot over its limit: %v", err)
	}

	m, _ := snapshot.ReadHeader(bytes.NewReader(snap))
	m.Python = "2.7.18"
	var other bytes.Buffer
	_ = snapshot.WriteHeader(&other, m)
	head, _ := snapshot.ReadHeader(bytes.NewReader(snap))
	other.Write(snap[int64(len(snap))-head.Sections[0].Bytes:])
	_, err = dst.c.Restore(ctx, &other, client.RestoreOptions{})
	if !client.IsStatus(err, http.StatusUnprocessableEntity) || !strings.Contains(err.Error(), "Python 2.7.18") {
		t.Errorf("snapshot of another Python: %v", err)
	}
}

// A workspace archive whose names climb out of the workspace is refused,
// even with hashes that match (a snapshot made by hand).
func TestRestoreKeepsWorkspaceFilesInside(t *testing.T) {
	src, dst := startAgent(t, 1), startAgent(t, 1)
	result(t, src, "x = 1")
	snap := takeSnapshot(t, src, client.SnapshotOptions{})
	m, err := snapshot.ReadHeader(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	ns := snap[int64(len(snap))-m.Sections[0].Bytes:]
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "../escaped", Size: 1, Mode: 0o644})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	sec, _ := snapshot.Hashed(snapshot.SectionWorkspace, bytes.NewReader(archive.Bytes()))
	m.Sections = append(m.Sections, sec)
	var bad bytes.Buffer
	_ = snapshot.WriteHeader(&bad, m)
	bad.Write(ns)
	bad.Write(archive.Bytes())
	_, err = dst.c.Restore(context.Background(), &bad, client.RestoreOptions{})
	if !client.IsStatus(err, http.StatusBadRequest) || !strings.Contains(err.Error(), "escapes the workspace") {
		t.Errorf("escaping workspace name: %v, want 400 naming the escape", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dst.ws), "escaped")); err == nil {
		t.Error("a file was written outside the workspace")
	}
}

// A restore that moves a Session off a drained node has the next run say
// so, once; a later restore that is no move clears a move not yet said; a
// move that is not a small JSON object is refused before anything changes.
func TestTheRunAfterAMoveSaysItMoved(t *testing.T) {
	ctx := context.Background()
	src, dst := startAgent(t, 1), startAgent(t, 1)
	result(t, src, "x = 41")
	snap := takeSnapshot(t, src, client.SnapshotOptions{})
	since := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	mv := &protocol.Moved{FromNode: "node-a", ToNode: "node-b", Reason: "node node-a is cordoned", Since: since}
	if _, err := dst.c.Restore(ctx, bytes.NewReader(snap), client.RestoreOptions{Moved: mv}); err != nil {
		t.Fatal(err)
	}
	res, err := dst.c.Execute(ctx, protocol.ExecuteRequest{Code: "x + 1"})
	if err != nil || res.Result == nil || *res.Result != "42" {
		t.Fatalf("first run after the move: %+v %v", res, err)
	}
	if res.Moved == nil || *res.Moved != *mv {
		t.Fatalf("the first run after the move says %+v, want %+v", res.Moved, mv)
	}
	if res, err := dst.c.Execute(ctx, protocol.ExecuteRequest{Code: "x"}); err != nil || res.Moved != nil {
		t.Fatalf("the second run says it moved again: %+v %v", res, err)
	}

	if _, err := dst.c.Restore(ctx, bytes.NewReader(snap), client.RestoreOptions{Moved: mv}); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.c.Restore(ctx, bytes.NewReader(snap), client.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := dst.c.Execute(ctx, protocol.ExecuteRequest{Code: "x"}); err != nil || res.Moved != nil {
		t.Fatalf("a restore that is no move left an older move to say: %+v %v", res, err)
	}

	huge := &protocol.Moved{FromNode: strings.Repeat("n", protocol.MaxMovedBytes)}
	_, err = dst.c.Restore(ctx, bytes.NewReader(snap), client.RestoreOptions{Moved: huge})
	if !client.IsStatus(err, http.StatusBadRequest) || !strings.Contains(err.Error(), protocol.QueryMoved) {
		t.Fatalf("an oversized move: want 400 naming %s, got %v", protocol.QueryMoved, err)
	}
}
