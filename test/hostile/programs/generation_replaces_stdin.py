# Replaces sys.stdin and closes fd 0 between runs: the server puts both back.
# status: succeeded
import os, sys
sys.stdin = None
os.close(0)
