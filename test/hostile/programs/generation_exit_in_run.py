# os._exit in a run: the run says the interpreter died, with the exit code.
# status: failed
# stateLost: true
# error: InterpreterDied
# reason: exit code 3
# stdout: "bye\n"
# e2e: true
import os
print("bye", flush=True)
os._exit(3)
