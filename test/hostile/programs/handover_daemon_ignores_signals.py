# A daemon that ignores every signal it can and renames itself: SIGKILL of
# every process but the agent still ends it.
# status: succeeded
# handover: true
# modes: sandbox
# check: import os
# check: me = os.readlink("/proc/self")
# check: def ppid(p):
# check:     s = open(f"/proc/{p}/stat").read()
# check:     return s[s.rindex(")") + 2:].split()[1]
# check: agent = ppid(me)
# check: left = []
# check: for p in os.listdir("/proc"):
# check:     if p.isdigit() and p not in (me, agent):
# check:         try:
# check:             cmd = open(f"/proc/{p}/cmdline", "rb").read()
# check:         except OSError:
# check:             continue
# check:         if b"warmpool-hostile" in cmd:
# check:             left.append(p)
# check: "clean" if not left else f"left {left}"
import subprocess, sys
code = """
import os, signal, time, ctypes
for s in range(1, 32):
    try:
        signal.signal(s, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):
        pass
ctypes.CDLL(None).prctl(15, b"kworker", 0, 0, 0)
if os.fork():
    os._exit(0)
os.setsid()
time.sleep(600)
"""
subprocess.Popen([sys.executable, "-c", code, "warmpool-hostile"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
