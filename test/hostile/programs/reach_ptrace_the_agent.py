# ptrace(PTRACE_ATTACH) on the agent fails.
# status: succeeded
# stdout: "ptrace: blocked\n"
# containment: namespaces
import ctypes, os
def agent_pid():
    # The agent as /proc shows it: the interpreter's parent.
    me = os.readlink("/proc/self")
    stat = open(f"/proc/{me}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
r = libc.ptrace(16, agent_pid(), None, None)  # PTRACE_ATTACH
print("ptrace:", "blocked" if r != 0 else "attached")
