# Forks a storm of short-lived processes that keep forking until the hand-over.
# status: succeeded
# handover: true
# modes: sandbox
# within: 5s
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
storm = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
"""
for _ in range(4):
    subprocess.Popen([sys.executable, "-c", storm, "warmpool-hostile"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
