# A segmentation fault in C: the run names the signal.
# status: failed
# stateLost: true
# error: InterpreterDied
# reason: signal
import ctypes
ctypes.string_at(0)
