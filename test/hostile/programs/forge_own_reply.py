# Answers for its own run with the run's id and secret (the code can lie about
# itself), but the REPL server's real reply then arrives with no request in
# flight: the interpreter is replaced, and the next run says so.
# status: succeeded
# result: 'forged'
# pause: 500ms
# next-stateLost: true
# next-reason: no request was in flight
import json, os, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
st = _server["_state"]
os.write(_server["_RPC_OUT"], b"\n" + json.dumps({"jsonrpc": "2.0", "id": st.run_id, "secret": st.secret,
    "result": {"status": "ok", "result": "'forged'", "error": None}}).encode() + b"\n")
time.sleep(0.3)
