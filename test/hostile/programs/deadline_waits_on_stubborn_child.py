# Waits for a child that ignores SIGINT and SIGTERM: the wait is interrupted,
# and the child, which holds no channel, is the session's to keep.
# status: timed_out
# timeout: 1s
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"])
p.wait()
