# A SIGALRM handler that raises after the run, in the REPL server's idle loop:
# the interpreter ends, and the next run says so.
# status: succeeded
# pause: 1s
# next-stateLost: true
# next-reason: exit code 1
import signal
signal.signal(signal.SIGALRM, lambda *a: 1 / 0)
signal.setitimer(signal.ITIMER_REAL, 0.2)
