# Reads the agent's memory, environment and descriptors through /proc: the
# agent is not dumpable, so each is refused. (A sandbox runs as a non-root
# user; root's own descriptors listing, in a daemon run as root, is root's.)
# status: succeeded
# stdout: "mem: blocked\nenviron: blocked\nfd: blocked\n"
# containment: namespaces
# modes: sandbox
# e2e: true
import os
def agent_pid():
    # The agent as /proc shows it: the interpreter's parent.
    me = os.readlink("/proc/self")
    stat = open(f"/proc/{me}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])
agent = agent_pid()
for name in ("mem", "environ"):
    try:
        with open(f"/proc/{agent}/{name}", "rb") as f:
            f.read(64)
        print(f"{name}: read")
    except OSError:
        print(f"{name}: blocked")
try:
    os.listdir(f"/proc/{agent}/fd")
    print("fd: listed")
except OSError:
    print("fd: blocked")
