# In the laptop daemon a reset ends the processes the code started, however
# they detached (the interpreter's namespace, or the process-tree sweep).
# status: succeeded
# handover: true
# modes: daemon
# check: import os, time
# check: time.sleep(0.3)
# check: pids = [l for l in open("pids").read().split()] if os.path.exists("pids") else []
# check: "clean" if not pids else "pids file survived"
import subprocess, sys, os
p = subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork(): os._exit(0)\nos.setsid()\ntime.sleep(600)", "warmpool-hostile"],
                     start_new_session=True, env={})
open("pids", "w").write(str(p.pid))
