// Package procs keeps track of the processes the agent starts itself, and makes
// the agent a child subreaper: processes that user code orphans are re-parented
// to the agent (as they are when it is PID 1 of a pod), where the agent can
// tell them apart from its own children, end them (internal/agent/interpreter)
// and reap them (internal/agent/reaper).
//
// Every child process of the agent must be started with Start and, once waited
// for, forgotten with Done.
package procs

import (
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	mu  sync.Mutex
	own = map[int]bool{}

	subreaper     sync.Once
	subreaperErr  error
	isSubreaperOK bool
)

// Start starts cmd and records its process as the agent's own. The record is
// made before anyone asking Own can see the process.
func Start(cmd *exec.Cmd) error {
	mu.Lock()
	defer mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	own[cmd.Process.Pid] = true
	return nil
}

// Done forgets a process started with Start, after it was waited for.
func Done(pid int) {
	mu.Lock()
	defer mu.Unlock()
	delete(own, pid)
}

// Own reports whether the agent started pid itself.
func Own(pid int) bool {
	mu.Lock()
	defer mu.Unlock()
	return own[pid]
}

// Locked runs f while no process can be started or forgotten, so that f can
// wait for children that are not the agent's own without racing exec.Cmd.
func Locked(f func(own func(pid int) bool)) {
	mu.Lock()
	defer mu.Unlock()
	f(func(pid int) bool { return own[pid] })
}

// BecomeSubreaper makes the agent a child subreaper (once); true when it is one.
// As PID 1 it is one anyway.
func BecomeSubreaper() bool {
	subreaper.Do(func() {
		subreaperErr = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
		isSubreaperOK = subreaperErr == nil
	})
	return isSubreaperOK
}
