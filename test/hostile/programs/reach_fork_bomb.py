# Forks until the sandbox's process limit says no, and leaves every child
# running: the code sees the limit as an error, the agent keeps answering, the
# children (which hold no channel) keep the state, and the next user finds none.
# status: succeeded
# stdout: "limit reached\n"
# modes: sandbox
# timeout: 20s
import os, time
n = 0
while True:
    try:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
    except OSError:
        print("limit reached" if n >= 50 else f"only {n}", flush=True)
        break
