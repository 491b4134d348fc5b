# Catches the deadline's KeyboardInterrupt and returns a value as if it had
# finished: still timed out (the deadline fired), the state kept.
# status: timed_out
# error: TimeoutError
# timeout: 1s
# e2e: true
import time
try:
    time.sleep(600)
except KeyboardInterrupt:
    pass
"finished normally"
