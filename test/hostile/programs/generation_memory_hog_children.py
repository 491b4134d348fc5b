# Forked processes that each stay under the per-process limit but pass the
# sandbox's memory budget together: the agent kills the tree and says why.
# status: failed
# stateLost: true
# error: MemoryLimitExceeded
# timeout: 30s
# within: 30s
import os, time
kids = []
for i in range(12):
    pid = os.fork()
    if pid == 0:
        block = bytearray(80 << 20)
        for j in range(0, len(block), 4096):
            block[j] = 1
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
time.sleep(60)
