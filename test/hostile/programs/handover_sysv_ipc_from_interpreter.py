# System V IPC objects the interpreter makes: they live in its IPC namespace
# (or the sandbox's) and are gone after the hand-over.
# status: succeeded
# handover: true
# modes: sandbox
# check: "clean" if all(len(open(f"/proc/sysvipc/{k}").read().splitlines()) <= 1 for k in ("shm", "msg", "sem")) else "left"
import ctypes
libc = ctypes.CDLL(None)
assert libc.shmget(0x57415250, 65536, 0o1600) >= 0
assert libc.msgget(0x57415251, 0o1600) >= 0
