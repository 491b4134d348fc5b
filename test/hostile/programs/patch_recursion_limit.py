# A recursion limit too low for the server's own calls.
# status: succeeded
import sys
sys.setrecursionlimit(25)
