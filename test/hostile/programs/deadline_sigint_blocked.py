# SIGINT blocked in the signal mask: the kill after the grace ends it.
# status: timed_out
# stateLost: true
# error: InterpreterKilled
# timeout: 1s
# grace: 500ms
import signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
time.sleep(600)
