package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// proc is one host process as /proc shows it.
type proc struct {
	pid, ppid int
	comm      string
	argv0     string
	exe       string
	// ticks is user+system CPU of all its threads; children counts what its
	// waited-for children used (the short-lived runsc commands of a shim).
	ticks, children uint64
	// pod is the UID of the pod whose cgroup holds it, "" for none.
	pod string
}

var podCgroup = regexp.MustCompile(`/pod([0-9a-f-]{36})`)

// snapshot reads every process of the host.
func snapshot() map[int]*proc {
	out := map[int]*proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p := readProc(pid)
		if p != nil {
			out[pid] = p
		}
	}
	return out
}

func readProc(pid int) *proc {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return nil
	}
	// comm is in parentheses and may hold spaces: the fields follow the last ')'.
	open, closing := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || closing < open {
		return nil
	}
	f := strings.Fields(string(stat[closing+2:]))
	if len(f) < 15 {
		return nil
	}
	num := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
	p := &proc{pid: pid, comm: string(stat[open+1 : closing])}
	p.ppid = int(num(1))
	// Fields 14-17 of stat (utime stime cutime cstime) are 11-14 here.
	p.ticks = num(11) + num(12)
	p.children = num(13) + num(14)
	if cmd, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		p.argv0 = string(bytes.SplitN(cmd, []byte{0}, 2)[0])
	}
	p.exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	if cg, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		if m := podCgroup.FindSubmatch(cg); m != nil {
			p.pod = string(m[1])
		}
	}
	return p
}

// nodeBusy returns the host's busy and total CPU ticks (all CPUs) from
// /proc/stat, and of the busy ticks those of interrupts (irq and softirq),
// which no process is charged with. Steal time (a VM's CPU given to others)
// counts as neither busy nor idle: it is in total.
func nodeBusy() (busy, total, interrupts uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	line := strings.SplitN(string(data), "\n", 2)[0]
	f := strings.Fields(line)[1:]
	for i, s := range f {
		v, _ := strconv.ParseUint(s, 10, 64)
		if i >= 8 { // guest time, already counted in user
			continue
		}
		total += v
		// Not idle, iowait or steal (time the hypervisor gave to others).
		if i != 3 && i != 4 && i != 7 {
			busy += v
		}
		if i == 5 || i == 6 {
			interrupts += v
		}
	}
	return busy, total, interrupts
}
