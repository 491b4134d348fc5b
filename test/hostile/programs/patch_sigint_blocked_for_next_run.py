# Leaves SIGINT blocked for the next run: the server unblocks it.
# status: succeeded
# next-code: while True: pass
# next-status: timed_out
# next-timeout: 1s
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
