# Sends itself SIGSTOP. In namespaces of its own the interpreter is their init,
# which a signal from inside cannot stop: it goes on. Without them it stops,
# and the agent's kill after the grace ends it.
# status: succeeded
# status.process-tree: timed_out
# stateLost: false
# timeout: 1s
# grace: 500ms
# containment: namespaces
import os, signal
os.kill(os.getpid(), signal.SIGSTOP)
"resumed"
