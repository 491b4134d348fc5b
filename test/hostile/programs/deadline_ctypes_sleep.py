# A sleep in C (libc.sleep through ctypes): the signal interrupts the system
# call and Python raises the KeyboardInterrupt when it returns.
# status: timed_out
# timeout: 1s
import ctypes
libc = ctypes.CDLL(None)
while True:
    libc.sleep(600)
