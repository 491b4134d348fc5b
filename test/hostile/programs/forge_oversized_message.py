# A 64 MB line on the channel, above the agent's message limit: read in
# bounded memory and ended as a violation.
# status: failed
# stateLost: true
# error: ProtocolViolation
# timeout: 30s
# within: 20s
import os, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
line = b"{" + b"x" * (64 << 20) + b"\n"
view = memoryview(line)
while view:
    view = view[os.write(_server["_RPC_OUT"], view):]
time.sleep(600)
