# The interpreter exits while idle while a detached child holds its stdout:
# the death is still reported by the next run.
# status: succeeded
# pause: 1500ms
# next-stateLost: true
# next-reason: exit code 5
import subprocess, sys, threading, os
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
threading.Timer(0.3, os._exit, [5]).start()
