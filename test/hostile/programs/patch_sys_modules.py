# Removes modules the server imported from sys.modules.
# status: succeeded
import sys
for name in ("json", "os", "io", "ast", "traceback", "signal", "fcntl"):
    sys.modules.pop(name, None)
