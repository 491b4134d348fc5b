# A call of a method no run may make, with the run's id and secret.
# status: failed
# stateLost: true
# error: ProtocolViolation
# within: 3s
import json, os, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
st = _server["_state"]
os.write(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": "x", "run": st.run_id, "secret": st.secret,
    "method": "shutdown", "params": {}}).encode() + b"\n")
time.sleep(600)
