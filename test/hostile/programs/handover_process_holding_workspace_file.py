# A detached process that holds a workspace file open and keeps writing to it.
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
# check: import time
# check: time.sleep(0.5)
# check: "clean" if not left and not os.listdir(".") else f"left {left} {os.listdir('.')}"
import subprocess, sys
subprocess.Popen([sys.executable, "-c",
    "import time\nf = open('held.log', 'a')\nwhile True:\n    f.write('x'); f.flush(); time.sleep(0.05)", "warmpool-hostile"],
    start_new_session=True)
