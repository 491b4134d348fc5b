// Package handover leaves nothing of one user in a sandbox that passes to the
// next (a FreshInterpreter pool's reset, and every reset with wipe): it ends
// every process the code may have left, empties the directories the code
// could write, removes System V IPC objects, and then checks that nothing is
// left. A sandbox that fails the check must not be offered again: the caller
// answers an error, and the manager deletes the pod (internal/controller/recycle).
//
// In a pod the agent is PID 1 of the sandbox's PID namespace and every other
// process is the code's (the interpreter, what it started, shell commands), so
// the sweep signals them all (kill(-1): every process but the caller and
// init), and the check finds none. Outside a pod (the laptop daemon) the
// interpreter's own process-tree sweep has ended what the code started
// (internal/agent/interpreter), and only the workspace and scratch
// directories are emptied: /dev/shm and IPC are the user's machine's.
package handover

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmpool/warmpool/internal/agent/workspace"
)

// Config says what a hand-over sweeps.
type Config struct {
	// Sandbox: the agent is PID 1 of the sandbox's PID and IPC namespaces,
	// and alone in them but for the code. Processes, /dev/shm, /dev/mqueue and
	// System V IPC are swept only then.
	Sandbox bool
	// Dirs are emptied (the workspace, /tmp).
	Dirs []string
	// Proc is the proc filesystem to read; default /proc.
	Proc string
}

// SandboxDirs are the shared-memory directories a sandbox's hand-over empties.
var SandboxDirs = []string{"/dev/shm", "/dev/mqueue"}

// sweepWait bounds how long the sweep waits for the processes it killed.
const sweepWait = 5 * time.Second

func (c Config) proc() string {
	if c.Proc == "" {
		return "/proc"
	}
	return c.Proc
}

func (c Config) dirs() []string {
	if !c.Sandbox {
		return c.Dirs
	}
	var out []string
	out = append(out, c.Dirs...)
	for _, d := range SandboxDirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// Sweep ends every process but the agent (in a sandbox), empties the
// directories and removes IPC objects, then checks that nothing is left.
// Call it with no interpreter running.
func (c Config) Sweep() error {
	var errs []error
	if c.Sandbox {
		if err := c.killAll(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, dir := range c.dirs() {
		if err := workspace.Empty(dir); err != nil {
			errs = append(errs, fmt.Errorf("empty %s: %w", dir, err))
		}
	}
	if c.Sandbox {
		if err := c.removeIPC(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.Verify(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Verify says what is left of the last user, nil when nothing.
func (c Config) Verify() error {
	var left []string
	if c.Sandbox {
		for _, pid := range c.others() {
			left = append(left, fmt.Sprintf("process %d (%s)", pid, c.comm(pid)))
		}
		for _, kind := range ipcKinds {
			for _, id := range c.ipcIDs(kind.file) {
				left = append(left, fmt.Sprintf("System V %s %d", kind.name, id))
			}
		}
	}
	for _, dir := range c.dirs() {
		entries, err := os.ReadDir(dir)
		if err != nil {
			left = append(left, fmt.Sprintf("%s (unreadable: %v)", dir, err))
			continue
		}
		for _, e := range entries {
			left = append(left, dir+"/"+e.Name())
		}
	}
	if len(left) == 0 {
		return nil
	}
	if len(left) > 10 {
		left = append(left[:10], fmt.Sprintf("and %d more", len(left)-10))
	}
	return fmt.Errorf("the last user's %s are still in the sandbox", strings.Join(left, ", "))
}

// killAll kills every process of the sandbox but the agent, until none is
// left or sweepWait passed: kill(-1) reaches each process the agent may
// signal but itself, and as PID 1 it may signal all of them. A process forked
// during one round is killed in the next.
func (c Config) killAll() error {
	deadline := time.Now().Add(sweepWait)
	for {
		others := c.others()
		if len(others) == 0 {
			return nil
		}
		if err := syscall.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill every process of the sandbox: %w", err)
		}
		if time.Now().After(deadline) {
			return nil // Verify names what is left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// others lists the sandbox's processes other than the agent that have not
// ended (zombies have: the agent's reaper collects them).
func (c Config) others() []int {
	self := os.Getpid()
	entries, err := os.ReadDir(c.proc())
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(c.proc() + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

func (c Config) comm(pid int) string {
	b, _ := os.ReadFile(c.proc() + "/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// System V IPC objects, by their /proc/sysvipc file: shared memory, message
// queues and semaphore sets.
var ipcKinds = []struct {
	name, file string
	remove     func(id int) error
}{
	{"shared memory segment", "shm", func(id int) error {
		_, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		return err
	}},
	{"message queue", "msg", func(id int) error {
		_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0)
		return errnoErr(e)
	}},
	{"semaphore set", "sem", func(id int) error {
		_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0)
		return errnoErr(e)
	}},
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func (c Config) removeIPC() error {
	var errs []error
	for _, kind := range ipcKinds {
		for _, id := range c.ipcIDs(kind.file) {
			if err := kind.remove(id); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.EIDRM) {
				errs = append(errs, fmt.Errorf("remove System V %s %d: %w", kind.name, id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ipcIDs lists the ids in /proc/sysvipc/FILE (the second column); none
// where the file does not exist (a kernel without System V IPC).
func (c Config) ipcIDs(file string) []int {
	f, err := os.Open(c.proc() + "/sysvipc/" + file)
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	var ids []int
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		if id, err := strconv.Atoi(fields[1]); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}
