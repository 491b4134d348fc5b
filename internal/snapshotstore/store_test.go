package snapshotstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
)

func startStore(t *testing.T) *objectstore.Server {
	t.Helper()
	srv, err := objectstore.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// bucket is a store on a bucket of a real S3 server, made for the test.
func bucket(t *testing.T) (*objectstore.Server, *snapshotstore.Store) {
	t.Helper()
	srv := startStore(t)
	st, err := srv.Store("snapshots", "warmpool/")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EnsureBucket(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv, st
}

// Against a real S3 server: a snapshot goes in sealed and comes back only
// for its own Session; another Session (another tenant's, or the same name
// made again) cannot open it, nor can a manager with another key; deleting
// a Session's snapshots leaves the others'.
func TestSnapshotsAreSealedAndBoundToTheirSession(t *testing.T) {
	srv, st := bucket(t)
	ctx := context.Background()
	alice := snapshotstore.Owner{Namespace: "tenant-a", UID: "uid-a"}
	bob := snapshotstore.Owner{Namespace: "tenant-b", UID: "uid-b"}
	data := bytes.Repeat([]byte("state "), 100000)

	key, err := st.Put(ctx, alice, data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Get(ctx, alice, key)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	// Not bob's: refused by its key, and by the seal when the key is forged.
	if _, err := st.Get(ctx, bob, key); err == nil || !strings.Contains(err.Error(), "not one of Session tenant-b") {
		t.Errorf("bob reads alice's snapshot: %v", err)
	}
	forged := strings.Replace(key, "tenant-a/uid-a", "tenant-b/uid-b", 1)
	objectStoreCopy(ctx, t, srv, key, forged)
	if _, err := st.Get(ctx, bob, forged); err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Errorf("alice's snapshot copied under bob's key: %v, want it not to open", err)
	}
	// The bytes at rest are not the plaintext.
	if stored := readRaw(ctx, t, srv, key); bytes.Contains(stored, []byte("state state")) {
		t.Error("the stored object holds the snapshot in the clear")
	}
	// Another manager key cannot open it.
	other, _ := snapshotstore.New(srv.Config("snapshots", "warmpool/"), bytes.Repeat([]byte{9}, 32))
	if _, err := other.Get(ctx, alice, key); err == nil || !strings.Contains(err.Error(), "sealed with key") {
		t.Errorf("another key: %v", err)
	}

	// DeleteAll removes alice's, keeps bob's.
	bobKey, _ := st.Put(ctx, bob, []byte("bob"))
	if err := st.DeleteAll(ctx, alice, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, alice, key); !errors.Is(err, snapshotstore.ErrNotFound) {
		t.Errorf("after DeleteAll: %v, want not found", err)
	}
	if got, err := st.Get(ctx, bob, bobKey); err != nil || string(got) != "bob" {
		t.Errorf("bob's after alice's DeleteAll: %q %v", got, err)
	}
}

// Latest finds a Session's newest snapshot, a checkpoint's or a suspend's,
// with the run a checkpoint is the state after, and none for a Session that
// has none; another Session's are not its.
func TestLatestIsTheNewestSnapshotOfItsSession(t *testing.T) {
	_, st := bucket(t)
	ctx := context.Background()
	alice := snapshotstore.Owner{Namespace: "tenant-a", UID: "uid-a"}
	bob := snapshotstore.Owner{Namespace: "tenant-a", UID: "uid-b"}
	if _, err := st.Latest(ctx, alice); !errors.Is(err, snapshotstore.ErrNotFound) {
		t.Fatalf("no snapshot yet: %v, want ErrNotFound", err)
	}
	if _, err := st.Put(ctx, alice, []byte("suspended")); err != nil {
		t.Fatal(err)
	}
	for run := int64(1); run <= 3; run++ {
		if _, err := st.PutCheckpoint(ctx, alice, run*10, []byte("run "+string(rune('0'+run)))); err != nil {
			t.Fatal(err)
		}
	}
	newest, err := st.PutCheckpoint(ctx, alice, 7, []byte("after a recovery, run 7 again"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutCheckpoint(ctx, bob, 99, []byte("bob's")); err != nil {
		t.Fatal(err)
	}
	got, err := st.Latest(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != newest || got.Run != 7 || got.Bytes != int64(len("after a recovery, run 7 again")) || got.Time.IsZero() {
		t.Fatalf("latest: %+v, want %s (run 7): the newest by time, not the highest run", got, newest)
	}
	if data, err := st.Get(ctx, alice, got.Key); err != nil || string(data) != "after a recovery, run 7 again" {
		t.Fatalf("get the latest: %q %v", data, err)
	}
	key, err := st.Put(ctx, alice, []byte("suspended again"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.Latest(ctx, alice); err != nil || got.Key != key || got.Run != 0 {
		t.Fatalf("after a suspend: %+v %v, want the suspend's snapshot %s", got, err, key)
	}
}
