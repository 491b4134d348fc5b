# Closes its own stdout and stderr and sleeps: the timeout still ends it, the
# REPL server restores both, and nothing is lost.
# status: timed_out
# timeout: 1s
import os, time
os.close(1)
os.close(2)
time.sleep(600)
