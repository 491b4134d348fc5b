# A pure-Python busy loop: SIGINT at the deadline stops it, the state stays.
# status: timed_out
# error: KeyboardInterrupt
# timeout: 1s
# e2e: true
while True:
    pass
