# One 100 MB line to stdout: cut to the limit, the run ends normally.
# status: succeeded
# timeout: 10s
# within: 20s
import sys
# The timeout: writing 100 MB took over the default 2 s once, with the rest of
# make test on the same 2 cores; the run's time is not what this program tests.
sys.stdout.write("z" * 100_000_000)
sys.stdout.flush()
