package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// What a durable Session's checkpoints need of the agent: a run sent while
// a checkpoint pickles the state waits for it instead of being refused; a
// wait for the end of a run; run numbers that go on across a restore; and
// neither counts as the Session's activity.

// A run that arrives while a checkpoint holds the interpreter runs once the
// state is pickled: the checkpoint is the manager's work, never the caller's
// 409. The checkpoint has the state before the run, and says how many runs
// it has seen.
func TestARunWaitsForACheckpointInsteadOfBeingRefused(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, 1)
	// Enough state that pickling it takes a while.
	result(t, a, "import os\nblob = os.urandom(48 << 20)\nx = 1")
	snapDone := make(chan []byte, 1)
	go func() {
		body, _, err := a.c.Snapshot(ctx, client.SnapshotOptions{Checkpoint: true})
		if err != nil {
			t.Errorf("checkpoint: %v", err)
			snapDone <- nil
			return
		}
		b, _ := io.ReadAll(body)
		_ = body.Close()
		snapDone <- b
	}()
	// The run is sent once the checkpoint holds the interpreter.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h, _ := a.c.Ready(ctx)
		if h != nil && h.Busy > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint never held the interpreter")
		}
	}
	res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "x += 1\nx"})
	if err != nil || res.Status != protocol.StatusSucceeded || res.Result == nil || *res.Result != "2" {
		t.Fatalf("a run sent during a checkpoint: %+v %v (want it run, not refused)", res, err)
	}
	if res.Run != 2 {
		t.Errorf("the run is numbered %d, want 2", res.Run)
	}
	snap := <-snapDone
	m, err := snapshot.ReadHeader(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	if m.Runs != 1 {
		t.Errorf("the checkpoint says it has seen %d runs, want 1 (it was taken before the second)", m.Runs)
	}
	dst := startAgent(t, 1)
	if _, err := dst.c.Restore(ctx, bytes.NewReader(snap), client.RestoreOptions{Runs: m.Runs}); err != nil {
		t.Fatal(err)
	}
	if got := result(t, dst, "x"); got != "1" {
		t.Errorf("the checkpoint's x is %s, want 1: it has the state before the run that waited", got)
	}
}

// A wait for quiet answers when a run started after it ends, not before,
// and not for a run it was told of; with nothing run it answers at its
// deadline, not quiet. Bad arguments are a 400.
func TestQuietAnswersWhenARunEnds(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, 1)
	q, err := a.c.Quiet(ctx, 0, 50*time.Millisecond)
	if err != nil || q.Quiet || q.Runs != 0 {
		t.Fatalf("nothing run: %+v %v, want not quiet at the deadline", q, err)
	}
	type answer struct {
		q  *protocol.Quiet
		at time.Time
	}
	got := make(chan answer, 1)
	go func() {
		q, err := a.c.Quiet(ctx, 0, 20*time.Second)
		if err != nil {
			t.Errorf("quiet: %v", err)
		}
		got <- answer{q, time.Now()}
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case g := <-got:
		t.Fatalf("quiet answered %+v before anything ran", g.q)
	default:
	}
	res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Code: "import time; time.sleep(0.3)"})
	if err != nil || res.Status != protocol.StatusSucceeded {
		t.Fatal(res, err)
	}
	g := <-got
	if !g.q.Quiet || g.q.Runs != 1 {
		t.Fatalf("after a run: %+v, want quiet after 1 run", g.q)
	}
	if g.at.Before(res.FinishedAt) {
		t.Errorf("quiet answered at %s, before the run ended at %s", g.at, res.FinishedAt)
	}
	if q, err := a.c.Quiet(ctx, 1, 50*time.Millisecond); err != nil || q.Quiet {
		t.Errorf("after=1 with one run: %+v %v, want not quiet", q, err)
	}
	for _, bad := range []string{"after=-1&waitMillis=10", "after=0&waitMillis=3600000", "waitMillis=10", "after=x&waitMillis=1"} {
		resp, err := a.c.Raw(ctx, http.MethodGet, protocol.PathQuiet+"?"+bad, nil, "", "")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("quiet?%s: %d, want 400", bad, resp.StatusCode)
		}
	}
}

// The manager's waits and checkpoints are not the Session's activity: a
// durable Session still reaches its idle timeout.
func TestCheckpointsAreNotActivity(t *testing.T) {
	ctx := context.Background()
	a := startAgent(t, 1)
	result(t, a, "x = 1")
	h, err := a.c.Ready(ctx)
	if err != nil || h.LastActivity == nil {
		t.Fatal(h, err)
	}
	before := *h.LastActivity
	time.Sleep(20 * time.Millisecond)
	if _, err := a.c.Quiet(ctx, 0, time.Second); err != nil {
		t.Fatal(err)
	}
	takeSnapshot(t, a, client.SnapshotOptions{Checkpoint: true})
	if h, err = a.c.Ready(ctx); err != nil || !h.LastActivity.Equal(before) {
		t.Fatalf("last activity %v after a quiet wait and a checkpoint, want %v", h.LastActivity, before)
	}
	takeSnapshot(t, a, client.SnapshotOptions{})
	if h, err = a.c.Ready(ctx); err != nil || !h.LastActivity.After(before) {
		t.Fatalf("a caller's snapshot is activity: last activity %v, want after %v", h.LastActivity, before)
	}
}
