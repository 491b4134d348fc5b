# Code that swallows every KeyboardInterrupt: killed after the grace, with its
# whole process tree, and the state is reported lost.
# status: timed_out
# stateLost: true
# error: InterpreterKilled
# timeout: 1s
# grace: 500ms
# e2e: true
import time
while True:
    try:
        time.sleep(0.05)
    except KeyboardInterrupt:
        pass
