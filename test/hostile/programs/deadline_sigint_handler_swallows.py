# A SIGINT handler of the code's own that returns: the sleep goes on, so the
# agent kills the interpreter after the grace.
# status: timed_out
# stateLost: true
# timeout: 1s
# grace: 500ms
import signal, time
signal.signal(signal.SIGINT, lambda *a: None)
time.sleep(600)
