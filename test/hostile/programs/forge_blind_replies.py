# Writes replies with guessed ids and no secret to the channel: a protocol
# violation, the interpreter replaced, never a result.
# status: failed
# stateLost: true
# error: ProtocolViolation
# within: 3s
# e2e: true
import json, os, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
forged = b"".join(b"\n" + json.dumps({"jsonrpc": "2.0", "id": i, "result": {"status": "ok", "result": "'forged'"}}).encode() + b"\n"
                  for i in range(1, 100))
os.write(_server["_RPC_OUT"], forged)
time.sleep(600)
