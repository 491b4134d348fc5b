# A process that stops itself (SIGSTOP) before the hand-over: killed all the same.
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
subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)", "warmpool-hostile"],
                 start_new_session=True)
