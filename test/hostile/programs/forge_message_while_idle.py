# Leaves a thread that writes a forged reply after the run ended, while no
# request is in flight: the interpreter is replaced at once, and the next run
# says so.
# status: succeeded
# pause: 1s
# next-stateLost: true
import json, os, threading, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
def later():
    time.sleep(0.3)
    os.write(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": "1", "result": {}}).encode() + b"\n")
threading.Thread(target=later, daemon=True).start()
