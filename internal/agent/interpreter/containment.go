package interpreter

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmpool/warmpool/internal/agent/procs"
)

// The interpreter in namespaces of its own.
//
// The code and the agent run as one user (a pod runs as one non-root user
// with every capability dropped, so the agent cannot give the interpreter
// another UID). Same-user processes may signal and trace each other; so the
// agent starts the interpreter in a new user namespace (mapping only the
// agent's own UID and GID, so files and limits are the same) and, within it, a
// new PID namespace and a new IPC namespace:
//
//   - The code cannot name the agent's process: kill, ptrace and
//     process_vm_readv take a PID of the caller's namespace, and
//     pidfd_send_signal refuses a process outside it (a pidfd made from
//     /proc/1). The agent is also not dumpable (cmd/agent), so its
//     /proc/PID/mem and environ are closed to the code.
//   - The interpreter is the namespace's init: when it ends, the kernel kills
//     every process the code started, however it forked, detached or hid.
//   - System V IPC objects and POSIX message queues the code makes live in
//     the namespace and go with it.
//
// Where the kernel refuses (a runc pod's RuntimeDefault seccomp profile blocks
// new user namespaces without CAP_SYS_ADMIN; a kernel may forbid unprivileged
// ones) the interpreter starts in the agent's namespaces, the process-tree
// sweep (procs.go) ends what it started, and readiness reports the
// containment as "process-tree".

// containment is how the interpreter is kept apart from the agent.
type containment int

const (
	containUnknown containment = iota
	containNamespaces
	containProcessTree
)

func (c containment) String() string {
	switch c {
	case containNamespaces:
		return "namespaces"
	case containProcessTree:
		return "process-tree"
	}
	return ""
}

// Containment names how the interpreter is kept apart: "namespaces" or
// "process-tree" ("" before it first started).
func (it *Interpreter) Containment() string {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.contain.String()
}

// start starts cmd in namespaces of its own when it can (decided once, at
// the first start), else as before.
func (it *Interpreter) start(cmd *exec.Cmd) error {
	it.mu.Lock()
	contain := it.contain
	it.mu.Unlock()
	base := syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if contain != containProcessTree && !it.cfg.NoNamespaces {
		// No Pdeathsig here: Go's child checks that its parent lives by
		// getppid, which is 0 in a new PID namespace, and then sends itself
		// the signal; Linux spares a namespace's init from its own SIGKILL,
		// gVisor does not (every interpreter died at start). The REPL server
		// asks for it itself (PR_SET_PDEATHSIG), and ends at EOF on its
		// request pipe when the agent is gone.
		attr := syscall.SysProcAttr{Setpgid: true}
		uid, gid := os.Getuid(), os.Getgid()
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		cmd.SysProcAttr = &attr
		err := startDumpable(cmd)
		if err == nil {
			it.setContainment(containNamespaces)
			return nil
		}
		if contain == containNamespaces || !refused(err) {
			return err
		}
		it.cfg.Log.Info("the kernel refuses new namespaces for the interpreter; it runs in the agent's, "+
			"and a process-tree sweep ends what it starts", "err", err.Error())
		renew(cmd) // without the namespaces
	}
	it.setContainment(containProcessTree)
	attr := base
	cmd.SysProcAttr = &attr
	return procs.Start(cmd)
}

// startRetries bounds the retries of a start that failed for the process
// limit: the processes of the interpreter just killed count until they are
// reaped (a fork bomb's hundreds take a moment).
const (
	startRetries = 40
	startBackoff = 50 * time.Millisecond
)

// startRetrying is start, tried again while the process limit refuses it.
func (it *Interpreter) startRetrying(cmd *exec.Cmd) error {
	for i := 0; ; i++ {
		err := it.start(cmd)
		if err == nil || !errors.Is(err, syscall.EAGAIN) || i == startRetries {
			return err
		}
		time.Sleep(startBackoff)
		renew(cmd)
	}
}

// renew makes cmd, whose start failed, startable again: a Cmd starts once.
func renew(cmd *exec.Cmd) {
	*cmd = exec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Stdin: cmd.Stdin,
		Stdout: cmd.Stdout, Stderr: cmd.Stderr, ExtraFiles: cmd.ExtraFiles}
}

// dumpableMu serialises the starts that make the agent dumpable a moment.
var dumpableMu sync.Mutex

// startDumpable starts cmd with the agent dumpable for the moment of the
// start: the agent is otherwise not (cmd/agent), and a child forked from a
// process that is not dumpable has its /proc files owned by root, so that
// the agent (not root) could not write the new user namespace's UID and GID
// maps. The child is dumpable again once it execs python3 (execve resets it).
// The window is the fork and the maps' writes; no code of the interpreter's
// runs then (the last generation's namespace is gone with its init).
func startDumpable(cmd *exec.Cmd) error {
	dumpableMu.Lock()
	defer dumpableMu.Unlock()
	was, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err == nil && was == 0 {
		_ = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
		defer func() { _ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }()
	}
	return procs.Start(cmd)
}

func (it *Interpreter) setContainment(c containment) {
	it.mu.Lock()
	it.contain = c
	it.mu.Unlock()
}

// refused says whether a start failed because new namespaces are not allowed.
func refused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) ||
		errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EUSERS)
}
