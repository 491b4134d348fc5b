# Acquires a lock it already holds: the acquire is interrupted at the deadline.
# status: timed_out
# timeout: 1s
import threading
lock = threading.Lock()
lock.acquire()
lock.acquire()
