# Starts threads until the process limit says no, and leaves them running:
# the run fails with the error the code saw, and the next run, finding the
# threads, starts on a fresh interpreter.
# status: failed
# error: RuntimeError
# modes: sandbox
# timeout: 20s
# next-stateLost: true
# next-reason: thread
import threading, time
threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(600,), daemon=True)
    t.start()
    threads.append(t)
