# Clears os.environ and breaks putenv.
# status: succeeded
import os
os.environ.clear()
os.putenv = None
