# os.abort(): the interpreter dies of SIGABRT (or, as its namespace's init, of
# the fault abort falls back on); the run says so.
# status: failed
# stateLost: true
# error: InterpreterDied
# reason: signal
import os
os.abort()
