# Prints as fast as it can until the deadline: timed out, stdout cut to the
# limit, the agent's memory bounded.
# status: timed_out
# timeout: 1s
# stdout-has: bytes of stdout omitted
while True:
    print("x" * 1000)
