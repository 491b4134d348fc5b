# Forks with the raw system call, past the server's at-fork hook, so the child
# keeps the channel: the agent finds the channel in the child's descriptors and
# replaces the interpreter before the next request.
# status: succeeded
# next-stateLost: true
# next-reason: holds the interpreter's channel
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(57)  # fork(2) on x86-64
if pid == 0:
    time.sleep(60)
    os._exit(0)
assert pid > 0, ctypes.get_errno()
