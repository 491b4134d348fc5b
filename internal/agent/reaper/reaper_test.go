package reaper

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmpool/warmpool/internal/agent/procs"
)

func zombiePIDs() []int {
	var out []int
	for _, z := range zombieChildren() {
		out = append(out, z.pid)
	}
	return out
}

// As PID 1 of a container the agent inherits orphans of user code; here the
// test process becomes a child subreaper to inherit them the same way.
func TestReapsOrphansButNotOwnChildren(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("prctl: %v", err)
	}
	// The agent's own child: a group leader that exec.Cmd waits for.
	own := exec.Command("sh", "-c", "exit 0")
	own.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := procs.Start(own); err != nil {
		t.Fatal(err)
	}
	// User code that leaves orphans behind: the grandchildren outlive their
	// parent, one of them in a session (and process group) of its own.
	parent := exec.Command("sh", "-c", "sleep 0.2 & setsid sleep 0.2 & exit 0")
	parent.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := parent.Run(); err != nil {
		t.Fatal(err)
	}
	// Wait until the orphans (sleep) have exited and are zombies of ours, next to the own child.
	for end := time.Now().Add(5 * time.Second); len(zombiePIDs()) < 3 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if len(zombiePIDs()) < 3 {
		t.Fatalf("setup: want the orphans and the own child as zombies, got %v", zombiePIDs())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx)
	_ = syscall.Kill(os.Getpid(), syscall.SIGCHLD)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && len(zombiePIDs()) != 1 {
		time.Sleep(20 * time.Millisecond)
	}
	if z := zombiePIDs(); len(z) != 1 || z[0] != own.Process.Pid {
		t.Fatalf("zombies left: %v (%+v), want only the own child %d (its exec.Cmd waits for it)", z, zombieChildren(), own.Process.Pid)
	}
	if err := own.Wait(); err != nil {
		t.Fatalf("the own child was reaped by the reaper: %v", err)
	}
}
