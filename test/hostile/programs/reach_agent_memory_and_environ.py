# Reads the agent's memory and environment through /proc. The memory is
# refused (the agent is not dumpable, and the code is in a user namespace of
# its own). Under gVisor the environment can be read, so the agent's holds
# nothing the code's does not: the pool's env, HOME, TMPDIR and the pod's UID.
# status: succeeded
# stdout: "mem: blocked\nenviron: nothing the code lacks\n"
# containment: namespaces
# e2e: true
import os
def agent_pid():
    # The agent as /proc shows it: the interpreter's parent.
    me = os.readlink("/proc/self")
    stat = open(f"/proc/{me}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])
agent = agent_pid()
try:
    with open(f"/proc/{agent}/mem", "rb") as f:
        f.read(64)
    print("mem: read")
except OSError:
    print("mem: blocked")
try:
    theirs = set(open(f"/proc/{agent}/environ", "rb").read().split(b"\0")) - {b""}
except OSError:
    theirs = set()
mine = set(open("/proc/self/environ", "rb").read().split(b"\0"))
extra = sorted(e.split(b"=")[0].decode() for e in theirs - mine)
print("environ:", "nothing the code lacks" if not extra else f"also {extra}")
