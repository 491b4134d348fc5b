# The last expression's __repr__ is still running at the deadline: the run is
# timed out, not succeeded, whatever the repr does after the interrupt.
# status: timed_out
# timeout: 1s
import time
class Slow:
    def __repr__(self):
        time.sleep(600)
        return "slow"
Slow()
