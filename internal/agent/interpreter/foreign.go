package interpreter

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	agentprocs "github.com/warmpool/warmpool/internal/agent/procs"
)

// Something the code left running can answer for a later request.
//
// A thread of the code shares the REPL server's process: it can read the next
// request from the channel before the server does, and answer it with the
// request's own id and secret, so that code that never ran is reported as
// having run. A process the code forked holds the same channel if it bypassed
// the server's at-fork hook. No secret protects a process from itself, so the
// agent makes sure, before it sends each request, that nobody but the REPL
// server's own threads can read it: it counts the interpreter's threads from
// /proc (the code cannot forge that count) against the count at start-up, and
// looks for the channel's pipes among the descriptors of every process the
// code started. An interpreter with either is replaced before the request is
// sent, and the request reports the state lost with the reason.
//
// So a run ends with the threads it started: a thread still running when the
// next request comes (a ThreadPoolExecutor not shut down, a daemon thread)
// costs the state. Threads that finish before then cost nothing.

// ErrorForeignPresence is the error type of state lost because the code left
// a thread or a process that could answer for a later request.
const ErrorForeignPresence = "LeftRunning"

// foreignGrace is how long a leftover is given to go before it counts: a
// thread that was joined is gone, but one that is ending, or a child forked
// a moment ago that has not yet run the at-fork hook that closes its copy of
// the channel, may take a moment. Something that means to answer stays.
const foreignGrace = 500 * time.Millisecond

// foreignPresence says what the code left that could answer for the next
// request, "" when nothing.
func foreignPresence(p *process) string {
	deadline := time.Now().Add(foreignGrace)
	for {
		why := leftover(p)
		if why == "" || time.Now().After(deadline) {
			return why
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leftover(p *process) string {
	if n := threadCount(p.pid()); p.threads > 0 && n > p.threads {
		return fmt.Sprintf("an earlier run left %d thread(s) running in the interpreter, which could answer for this request; "+
			"join your threads (or shut down your executors) before a run ends", n-p.threads)
	}
	for _, pid := range codeProcesses(p.pid(), p.contained) {
		if holdsPipe(pid, p.pipes) {
			return fmt.Sprintf("process %d, which an earlier run started, holds the interpreter's channel to the agent "+
				"and could answer for this request", pid)
		}
	}
	return ""
}

// threadCount is the number of threads of a process, 0 if it is gone.
func threadCount(pid int) int {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	return len(entries)
}

// codeProcesses lists the processes the code started: the interpreter's
// descendants, and, unless the interpreter is its PID namespace's init (in
// which case every orphan of the code is re-parented to it), the agent's
// children it did not start itself (orphans re-parented to the agent) with
// their descendants.
func codeProcesses(root int, contained bool) []int {
	var out []int
	visit := func(pid int) {
		if pid != root {
			out = append(out, pid)
		}
	}
	walkTree(root, visit)
	if contained {
		return out
	}
	for _, c := range childrenOf(os.Getpid()) {
		if c != root && !agentprocs.Own(c) {
			walkTree(c, visit)
		}
	}
	return out
}

// holdsPipe reports whether the process has one of the pipes open.
func holdsPipe(pid int, pipes [2]uint64) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "pipe:[") {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pipe:["), "]"), 10, 64)
		if n != 0 && (n == pipes[0] || n == pipes[1]) {
			return true
		}
	}
	return false
}

// inode is the inode number of an open file, 0 if unknown. (Not by f.Fd(),
// which would take the pipe out of the poller and its write deadline.)
func inode(f *os.File) uint64 {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
