# A long sleep is interrupted at the deadline with its output kept.
# status: timed_out
# timeout: 1s
# stdout: "before\n"
print("before", flush=True)
import time
time.sleep(600)
