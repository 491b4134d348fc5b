# Closes the REPL server's request descriptor: the server cannot read the next
# request and ends; the next run says the state is lost.
# status: succeeded
# pause: 1s
# next-stateLost: true
import os
_server = FINAL.__globals__  # the REPL server's module: its channel, its state
os.close(_server["_RPC_IN"])
