# Writes to stderr without a newline until the deadline.
# status: timed_out
# timeout: 1s
import os
while True:
    os.write(2, b"y" * 65536)
