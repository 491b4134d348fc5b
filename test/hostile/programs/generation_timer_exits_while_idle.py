# A timer that calls os._exit after the run ended: the interpreter dies while
# idle, is restarted at once, and the next run says the state was lost, why.
# status: succeeded
# pause: 1s
# next-stateLost: true
# next-reason: exit code 7
# e2e: true
import os, threading
threading.Timer(0.2, os._exit, [7]).start()
