# Points the reply descriptor at /dev/null but keeps the pipe open elsewhere:
# no EOF and no reply, yet the deadline and the kill after the grace end it.
# status: timed_out
# stateLost: true
# error: InterpreterKilled
# timeout: 1s
# grace: 500ms
# e2e: true
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
import os, time
keep = os.dup(_server["_RPC_OUT"])
os.dup2(os.open("/dev/null", os.O_WRONLY), _server["_RPC_OUT"])
while True:
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        pass
