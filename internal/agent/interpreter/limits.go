package interpreter

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// Resource limits of the code: hit as errors the code can see, before the
// container's own limits end the whole pod (and with it every trace of what
// the code printed).
//
//   - Memory. RLIMIT_AS on the interpreter (inherited by every process it
//     starts) makes an allocation past the budget fail inside Python as
//     MemoryError: the interpreter lives on and the run ends with that
//     exception and its output. The limit is per process, so a watchdog also
//     sums the resident memory of the interpreter and its descendants while
//     code runs; past the budget it kills them all and the run ends
//     MemoryLimitExceeded, with the output so far. The budget is set a little
//     below the container's limit (the manager reserves room for the agent
//     and the runtime), so the container's OOM kill is the last resort.
//   - Processes. RLIMIT_NPROC on the interpreter: fork and thread creation
//     past it fail with EAGAIN (BlockingIOError in Python) while the agent,
//     which does not carry the limit, keeps answering. Linux and gVisor count
//     every task of the user: under gVisor (one kernel per sandbox) that is
//     the sandbox's own count, the agent's threads included; under runc the
//     count is node-wide for the sandbox user, so such pools should turn it
//     off and use the kubelet's podPidsLimit instead.
//
// Both are applied to the interpreter process right after it starts, before
// it reads its first request, and as hard limits: the code runs without
// CAP_SYS_RESOURCE and cannot raise them.

// Limits bound what the code may use; zero fields are not limited.
type Limits struct {
	// MemoryBytes bounds the address space of each process (RLIMIT_AS) and the
	// summed resident memory of the interpreter and its descendants.
	MemoryBytes int64
	// Processes bounds the tasks (processes and threads) of the sandbox user
	// that the code can create (RLIMIT_NPROC).
	Processes int
}

// ErrorMemoryLimitExceeded is the error type of a run whose processes were
// killed for using more memory than the budget together.
const ErrorMemoryLimitExceeded = protocol.ErrorMemoryLimitExceeded

// memoryPollInterval is how often the watchdog sums resident memory while
// code runs. A single process is stopped by RLIMIT_AS without polling; the
// watchdog is for many processes that each stay below it.
const memoryPollInterval = 100 * time.Millisecond

// threadStackBytes is the stack of threads the code starts with threading
// under a memory limit (glibc's default is RLIMIT_STACK, 8 MiB), and
// mallocArenas caps glibc's per-thread malloc arenas, each of which reserves
// 64 MiB of address space: with both left alone, RLIMIT_AS would let a 512Mi
// sandbox start fewer than ten threads.
const (
	threadStackBytes = 2 << 20
	mallocArenas     = 2
)

// singleThreaded are the thread counts of the numeric libraries (OpenBLAS,
// OpenMP, MKL, numexpr). Each sizes its pool from the node's cores, not the
// sandbox's CPU limit, and OpenBLAS reserves a buffer of 32 MiB and more per
// thread: on a large node that is past a sandbox's RLIMIT_AS, where OpenBLAS
// hangs in its allocator instead of failing (seen with pandas and matplotlib
// preloaded: a 3x3 dot product never returned).
var singleThreaded = []string{"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_MAX_THREADS"}

// env returns what the interpreter's environment needs, leaving alone what
// env (the pool's own settings) already says. The numeric libraries run one
// thread each always: a pool of threads a library starts in a run would
// count as threads the code left running (foreign.go), and a sandbox has its
// own CPU limit, not the node's cores. Under a memory limit, malloc arenas
// and thread stacks are kept small too.
func (l Limits) env(env []string) []string {
	set := func(name string) bool {
		return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
	}
	var out []string
	for _, name := range singleThreaded {
		if !set(name) {
			out = append(out, name+"=1")
		}
	}
	if l.MemoryBytes <= 0 {
		return out
	}
	if !set("MALLOC_ARENA_MAX") {
		out = append(out, fmt.Sprintf("MALLOC_ARENA_MAX=%d", mallocArenas))
	}
	return append(out, fmt.Sprintf("WARMPOOL_THREAD_STACK_BYTES=%d", threadStackBytes))
}

func applyLimits(pid int, l Limits) error {
	if l.MemoryBytes > 0 {
		lim := unix.Rlimit{Cur: uint64(l.MemoryBytes), Max: uint64(l.MemoryBytes)}
		if err := unix.Prlimit(pid, unix.RLIMIT_AS, &lim, nil); err != nil {
			return fmt.Errorf("set the memory limit (RLIMIT_AS %d): %w", l.MemoryBytes, err)
		}
	}
	if l.Processes > 0 {
		lim := unix.Rlimit{Cur: uint64(l.Processes), Max: uint64(l.Processes)}
		if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &lim, nil); err != nil {
			return fmt.Errorf("set the process limit (RLIMIT_NPROC %d): %w", l.Processes, err)
		}
	}
	return nil
}

// memoryWatch kills a process tree whose resident memory together passes a
// budget. It polls only while started (a run is in flight).
type memoryWatch struct {
	budget int64
	// over is the resident total that made the watchdog kill, 0 if it did not.
	over atomic.Int64
}

// watch polls until stop is closed or the tree was killed.
func (w *memoryWatch) watch(p *process, stop <-chan struct{}) {
	tick := time.NewTicker(memoryPollInterval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-p.exited:
			return
		case <-tick.C:
		}
		if total := codeMemory(p.cmd.Process.Pid); total > w.budget {
			w.over.Store(total)
			p.kill()
			return
		}
	}
}

// overError describes the kill, "" if the watchdog did not kill.
func (w *memoryWatch) overError() string {
	total := w.over.Load()
	if total == 0 {
		return ""
	}
	return fmt.Sprintf("the code's processes used %s of memory together, more than the sandbox's budget of %s: "+
		"they were killed", mib(total), mib(w.budget))
}

func mib(b int64) string { return strconv.FormatInt(b>>20, 10) + " MiB" }

var pageSize = int64(os.Getpagesize())

// codeMemory is the memory the code's processes use together. On Linux it
// is the proportional set size of the interpreter's tree (a page that forked
// processes share counts once). gVisor has no smaps_rollup; there it is the
// summed resident sets, which count shared pages in each process: measured on
// the local cluster, that is what a fork loop really costs the container
// (gVisor copies on write in 2 MiB units, and each process has host-side
// overhead that the sandbox's own /proc/meminfo does not show; with meminfo
// the container was OOM-killed at about 35 forks, with resident sets the
// watchdog stopped the code first).
func codeMemory(root int) int64 {
	if pss, ok := treePSS(root); ok {
		return pss
	}
	return treeRSS(root)
}

// treePSS sums Pss from /proc/PID/smaps_rollup over root and its
// descendants; false where the kernel has no smaps_rollup.
func treePSS(root int) (int64, bool) {
	var total int64
	ok := true
	walkTree(root, func(pid int) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
		if err != nil {
			ok = ok && pid != root // a descendant may just have exited
			return
		}
		total += kbField(b, "Pss:")
	})
	return total, ok
}

// kbField reads "Name:   123 kB" from a /proc file, in bytes.
func kbField(b []byte, name string) int64 {
	i := bytes.Index(b, []byte(name))
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+len(name):])
	if len(f) == 0 {
		return 0
	}
	kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
	return kb << 10
}

// treeRSS sums the resident memory of root and its descendants. Descendants
// are found through /proc/PID/task/TID/children (the REPL server is a child
// subreaper, so orphans of the code stay in its tree); shared pages of forked
// processes are counted in each, which errs on the side of the container.
func treeRSS(root int) int64 {
	var total int64
	walkTree(root, func(pid int) { total += rssOf(pid) })
	return total
}

func walkTree(root int, visit func(pid int)) {
	seen := map[int]bool{}
	for stack := []int{root}; len(stack) > 0; {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		visit(pid)
		stack = append(stack, childrenOf(pid)...)
	}
}

func rssOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0 // gone
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * pageSize
}

func childrenOf(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
