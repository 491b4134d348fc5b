# One 100 MB line to stdout: cut to the limit, the run ends normally.
# status: succeeded
# within: 20s
import sys
sys.stdout.write("z" * 100_000_000)
sys.stdout.flush()
