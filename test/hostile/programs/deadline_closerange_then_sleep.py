# Closes every descriptor from 3 up (the REPL server's channel to the agent
# among them) and sleeps: the closed channel is a protocol violation, ended at
# once, long before the two-second deadline (it used to run for a minute).
# status: failed
# stateLost: true
# error: ProtocolViolation
# reason: closed its channel
# within: 2s
# e2e: true
import os, time
os.closerange(3, 65536)
time.sleep(600)
