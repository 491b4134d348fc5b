# A System V shared memory segment made by a shell command (shell commands run
# in the sandbox's own IPC namespace, not the interpreter's): removed by the
# hand-over.
# status: succeeded
# handover: true
# modes: sandbox
# check: "clean" if len(open("/proc/sysvipc/shm").read().splitlines()) <= 1 else open("/proc/sysvipc/shm").read()
python3 -c 'import ctypes; libc = ctypes.CDLL(None); assert libc.shmget(0x5741524d, 65536, 0o1600) >= 0; assert libc.msgget(0x5741524e, 0o1600) >= 0; assert libc.semget(0x5741524f, 1, 0o1600) >= 0'
