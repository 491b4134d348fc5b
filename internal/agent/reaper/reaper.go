// Package reaper reaps orphaned zombie processes when the agent is PID 1 of its
// container: user code can start processes that outlive their parent, and
// nobody else would wait for them.
package reaper

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/warmpool/warmpool/internal/agent/procs"
)

// Run reaps zombies that are the agent's children but were not started by the
// agent itself (procs.Own), until ctx ends: orphans of user code, re-parented
// to the agent because it is PID 1 or a child subreaper. The agent's own
// children are waited for by their exec.Cmd.
//
// It wakes on SIGCHLD only, never on a timer: an idle sandbox must cost no
// CPU (a /proc scan every few seconds in each of a hundred warm pods under
// gVisor is not free). Signals coalesce but are not lost (one is kept while
// the last is handled, and each wake-up reaps every zombie), and Linux
// signals a subreaper that adopts an orphan that has already exited. A zombie missed all the
// same holds a PID slot until the next child exits or the interpreter is
// reset, which ends and reaps every process of the code.
func Run(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	reapOrphans() // the ones that died before the signal handler was in place
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		}
		reapOrphans()
	}
}

func reapOrphans() {
	procs.Locked(func(own func(int) bool) {
		for _, z := range zombieChildren() {
			if !own(z.pid) {
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(z.pid, &ws, syscall.WNOHANG, nil)
			}
		}
	})
}

type zombie struct{ pid, pgrp int }

// zombieChildren lists this process's children that have exited and not been waited for.
func zombieChildren() []zombie {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []zombie
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp ...
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 3 || string(f[0]) != "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		pgrp, _ := strconv.Atoi(string(f[2]))
		if ppid == self {
			out = append(out, zombie{pid: pid, pgrp: pgrp})
		}
	}
	return out
}
