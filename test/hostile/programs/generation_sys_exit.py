# sys.exit() is an exception like any other: the interpreter lives on.
# status: failed
# error: SystemExit
sys_exit_code = 4
import sys
sys.exit(sys_exit_code)
