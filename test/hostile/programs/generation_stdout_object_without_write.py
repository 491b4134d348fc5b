# Replaces sys.stdout and sys.stderr with objects that cannot write: the next
# run prints as usual.
# status: succeeded
# next-code: print("printed"); "ok"
# next-status: succeeded
import sys
sys.stdout = object()
sys.stderr = 42
