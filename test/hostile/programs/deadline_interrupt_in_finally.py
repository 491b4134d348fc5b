# Runs more code in a finally after the interrupt, within the grace: timed out,
# with the finally's output, the state kept.
# status: timed_out
# timeout: 1s
# stdout-has: cleanup
import time
try:
    time.sleep(600)
finally:
    print("cleanup", flush=True)
