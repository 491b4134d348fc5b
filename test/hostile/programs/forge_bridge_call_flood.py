# 100,000 bridge calls with the run's own id and secret (the agent's memory
# grew to 553 MB): the second unanswered call is a violation, and the agent
# holds one call at most.
# status: failed
# stateLost: true
# error: ProtocolViolation
# timeout: 30s
# within: 20s
# e2e: true
import json, os
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
st = _server["_state"]
msg = b"".join(b"\n" + json.dumps({"jsonrpc": "2.0", "id": f"b9-{i}", "run": st.run_id, "secret": st.secret,
    "method": "llm_query", "params": {"prompt": "x"}}).encode() + b"\n" for i in range(100_000))
view = memoryview(msg)
try:
    while view:
        view = view[os.write(_server["_RPC_OUT"], view):]
except OSError:
    pass
import time
time.sleep(600)
