package interpreter

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	agentprocs "github.com/warmpool/warmpool/internal/agent/procs"
)

// Ending every process the code started.
//
// Killing the interpreter's process group is not enough: a subprocess started
// with start_new_session=True or setsid leaves the group, and one whose parent
// exits is re-parented out of the interpreter's tree. Such a process would
// survive a reset and keep the interpreter's output pipes open. So:
//
//   - The REPL server makes itself a child subreaper (PR_SET_CHILD_SUBREAPER):
//     orphans of the code's processes are re-parented to the interpreter, not
//     to init or the agent, so every process the code started, in whatever
//     session or group, stays a descendant of the interpreter while it lives.
//   - Every process the interpreter starts inherits tagVar=<random tag> in its
//     environment, which finds those that left the tree after all (the code
//     cleared the subreaper flag, or the interpreter died and its descendants
//     were re-parented).
//   - The agent is a child subreaper too (PID 1 in a pod; procs.BecomeSubreaper
//     elsewhere, tests included), so what leaves the interpreter's tree comes to
//     the agent. Its children that it did not start itself (procs.Own) and that
//     carry no other interpreter's tag are orphans of user code: they are ended
//     with the interpreter too. (With several interpreters such an untagged
//     orphan cannot be attributed to one; it is ended with the first to go.)
//
// killProcesses stops (SIGSTOP) all of those, walking /proc again until no new
// one shows up, so none can fork behind the walk; then it kills them, waits
// (briefly) until they are gone, and reaps those that are the agent's children.
// Processes are held by pidfd between the walk and the signal, so a PID reused
// meanwhile is never hit.
//
// Clean interrupts (the code stopped at SIGINT) end no processes: background
// processes are part of the session's state, like its variables.

// tagVar names the environment variable that marks the interpreter's processes.
const tagVar = "WARMPOOL_INTERPRETER_TAG"

type procStat struct {
	state byte // R, S, D, Z (a zombie: exited, not reaped yet)...
	ppid  int
	start uint64
}

// readStat returns a process's state, parent and start time from /proc.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	// Fields after the command: state(3) ppid(4) ... starttime(22).
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	start, _ := strconv.ParseUint(string(f[19]), 10, 64)
	return procStat{state: f[0][0], ppid: ppid, start: start}, true
}

func allProcs() map[int]procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make(map[int]procStat, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			out[pid] = st
		}
	}
	return out
}

// tagOf returns the value of tagVar in the process's environment, "" if none
// (or the environment cannot be read: another user's process, or a zombie).
func tagOf(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(tagVar+"=")); ok {
			return string(v)
		}
	}
	return ""
}

// target is a process to kill, held by a pidfd so a reused PID is never hit.
type target struct {
	pid int
	fd  int // -1 without pidfd support
}

func openTarget(pid int, st procStat) (*target, bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, syscall.ENOSYS) {
		return &target{pid: pid, fd: -1}, true
	}
	if err != nil {
		return nil, false
	}
	// The PID could have been reused between the walk and the open.
	if now, ok := readStat(pid); !ok || now.start != st.start {
		_ = unix.Close(fd)
		return nil, false
	}
	return &target{pid: pid, fd: fd}, true
}

func (t *target) signal(sig syscall.Signal) {
	if t.fd >= 0 {
		_ = unix.PidfdSendSignal(t.fd, sig, nil, 0)
	} else {
		_ = syscall.Kill(t.pid, sig)
	}
}

// wait waits until the process has exited (it may be a zombie) or the deadline.
func (t *target) wait(deadline time.Time) {
	if t.fd < 0 {
		return
	}
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLIN}}, ms)
		if n > 0 || (err != nil && !errors.Is(err, syscall.EINTR)) {
			return
		}
	}
}

// reap collects the process if it became the agent's child (the agent is PID 1
// or a subreaper); an error just means someone else's.
func (t *target) reap() {
	if t.fd >= 0 {
		var info unix.Siginfo
		_ = unix.Waitid(unix.P_PIDFD, t.fd, &info, unix.WEXITED|unix.WNOHANG, nil)
	}
}

// killProcesses kills root (0: none) with all its descendants, every process
// whose environment carries tagVar=tag, and the agent's untagged orphans, each
// with its descendants.
func killProcesses(root int, tag string) {
	self := os.Getpid()
	found := map[int]*target{}
	for round := 0; round < 100; round++ {
		procs := allProcs()
		children := map[int][]int{}
		for pid, st := range procs {
			children[st.ppid] = append(children[st.ppid], pid)
		}
		var tops []int
		if _, ok := procs[root]; ok && root > 0 {
			tops = append(tops, root)
		}
		for pid, st := range procs {
			if _, seen := found[pid]; seen || pid == self || pid == root {
				continue
			}
			switch t := tagOf(pid); {
			case tag != "" && t == tag:
				tops = append(tops, pid)
			case t == "" && st.ppid == self && !agentprocs.Own(pid):
				tops = append(tops, pid) // an orphan re-parented to the agent
			}
		}
		var todo []int
		for stack := tops; len(stack) > 0; {
			pid := stack[len(stack)-1]
			stack = append(stack[:len(stack)-1], children[pid]...)
			todo = append(todo, pid)
		}
		added := 0
		for _, pid := range todo {
			if _, seen := found[pid]; seen || pid == self {
				continue
			}
			t, ok := openTarget(pid, procs[pid])
			if !ok {
				continue
			}
			found[pid] = t
			t.signal(syscall.SIGSTOP) // a stopped process cannot fork behind the walk
			added++
		}
		if added == 0 {
			break
		}
	}
	for _, t := range found {
		t.signal(syscall.SIGKILL)
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, t := range found {
		t.wait(deadline)
		if t.pid != root { // exec.Cmd waits for the interpreter itself
			t.reap()
		}
		if t.fd >= 0 {
			_ = unix.Close(t.fd)
		}
	}
}
