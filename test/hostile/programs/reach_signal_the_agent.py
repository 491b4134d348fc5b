# Tries every way to signal the agent (SIGTERM and SIGSTOP by its PID, and by
# a pidfd made from /proc): each fails, and the agent is unharmed.
# status: succeeded
# stdout: "pidfd: blocked\n"
# containment: namespaces
# e2e: true
import ctypes, os, signal
def agent_pid():
    # The agent as /proc shows it: the interpreter's parent.
    me = os.readlink("/proc/self")
    stat = open(f"/proc/{me}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])
agent = agent_pid()
# By its PID: in a PID namespace of its own the number names another process
# of the code's, or none. The harness checks the agent afterwards: the same
# process, not stopped, answering.
# (When the agent's number is the interpreter's own, as in a pod where both
# are PID 1 of their namespaces, it names the interpreter itself: skipped.)
for sig in (signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):
    if agent == os.getpid():
        break
    try:
        os.kill(agent, sig)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(f"/proc/{agent}", os.O_RDONLY | os.O_DIRECTORY)
r = libc.syscall(424, fd, signal.SIGTERM, None, 0)  # pidfd_send_signal
print("pidfd:", "blocked" if r != 0 else "sent")
import time
time.sleep(0.2)
