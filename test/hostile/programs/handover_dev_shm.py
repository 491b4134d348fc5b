# Leaves a file in /dev/shm (POSIX shared memory) for the next user.
# status: succeeded
# handover: true
# modes: sandbox
# e2e: true
# check: import os
# check: "clean" if not os.listdir("/dev/shm") else f"left {os.listdir('/dev/shm')}"
open("/dev/shm/warmpool-hostile", "w").write("secret of the last user")
