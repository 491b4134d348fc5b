# SIGKILL to itself: without namespaces the interpreter dies and the run says
# so; as its namespace's init it cannot be killed from inside, and goes on.
# status: succeeded
# status.process-tree: failed
# containment: namespaces
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"alive"
