# A trace and a profile function that raise in every frame but the code's own:
# the server's frames run untraced.
# status: succeeded
import sys
_mine = globals()
def tracer(frame, event, arg):
    if frame.f_globals is not _mine:
        raise RuntimeError("traced")
    return tracer
sys.settrace(tracer)
sys.setprofile(tracer)
