# SIGINT set to SIG_IGN: the interrupt does nothing, the kill after the grace does.
# status: timed_out
# stateLost: true
# error: InterpreterKilled
# timeout: 1s
# grace: 500ms
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
time.sleep(600)
