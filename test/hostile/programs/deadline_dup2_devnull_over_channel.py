# dup2s /dev/null over every descriptor from 3 up: the agent's reply pipe
# loses its writer (EOF), which ends the run as a protocol violation.
# status: failed
# stateLost: true
# error: ProtocolViolation
# within: 2s
# e2e: true
import os, time
null = os.open("/dev/null", os.O_RDWR)
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd > 2 and fd != null:
        try:
            os.dup2(null, fd)
        except OSError:
            pass
time.sleep(600)
