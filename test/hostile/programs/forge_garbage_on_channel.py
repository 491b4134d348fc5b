# An unterminated fragment and bytes that are not UTF-8 on the channel.
# status: failed
# stateLost: true
# error: ProtocolViolation
# within: 3s
import os, time
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
os.write(_server["_RPC_OUT"], b'\xff\xfe{"jsonrpc": "2.0", "id": \n')
time.sleep(600)
