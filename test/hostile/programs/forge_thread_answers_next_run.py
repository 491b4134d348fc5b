# Leaves a thread that takes the next request off the channel and answers it:
# the agent finds the thread before it sends the request, replaces the
# interpreter, and the next run runs its own code and says why its state went.
# status: succeeded
# next-stateLost: true
# next-reason: thread
# e2e: true
import json, os, threading
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
def answer():
    data = os.read(_server["_RPC_IN"], 1 << 20)
    req = json.loads(data.splitlines()[0])
    os.write(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": req["id"], "secret": req.get("secret"),
        "result": {"status": "ok", "result": "(True, 42)", "error": None}}).encode() + b"\n")
threading.Thread(target=answer, daemon=True).start()
