# Breaks traceback and then raises: the error still comes back, without a
# traceback, and the server lives on.
# status: failed
# error: ValueError
import traceback
traceback.format_exception = lambda *a, **k: 1 / 0
traceback.format_exception_only = None
raise ValueError("broken traceback module")
