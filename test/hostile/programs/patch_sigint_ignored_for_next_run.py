# Leaves SIGINT ignored for the next run: the server takes its handler back, so
# the next run's deadline still interrupts (no kill, state kept).
# status: succeeded
# next-code: while True: pass
# next-status: timed_out
# next-timeout: 1s
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
