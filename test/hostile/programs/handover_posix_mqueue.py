# A POSIX message queue.
# status: succeeded
# handover: true
# modes: sandbox
# check: import os
# check: "clean" if not os.path.isdir("/dev/mqueue") or not os.listdir("/dev/mqueue") else f"left {os.listdir('/dev/mqueue')}"
import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
assert rt.mq_open(b"/warmpool-hostile", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, ctypes.get_errno()
