"""The lost-answer recovery of a Session run (docs/recovery.md): what a
client does when a run's answer does not come back (a data-plane replica
stopped, a connection broke). The same cases hold for the Go and TypeScript
clients (pkg/protocol/testdata/recovery.json).

A run that never left (503: refused before it was sent on; no connection)
is sent again, after 200 ms, then twice as long each time, MAX_RESENDS
times. A run whose answer was lost (502, a cut stream, a broken connection)
is asked about by its ID: its stored result, or the rest of its stream by
attaching to it; only if its agent never had it (404 once RECOVER_GRACE has
passed) is it sent again. The code never runs twice."""

import time

import urllib3

from . import _api, errors
from .execution import Execution

MAX_RESENDS = 3
RESEND_DELAY = 0.2

# How long a run unknown to its Session's agent may still reach it (a request
# a gone data-plane replica had sent), and how long the lookup of a run whose
# answer was lost may take.
RECOVER_GRACE = 1.0
RECOVER_TIMEOUT = 60.0
# One question about the run: the API server's proxy may still send it to
# the replica that went away, whose address then answers nothing; the next
# question goes elsewhere.
ASK_TIMEOUT = 5.0


def lost_state(session, ex):
    """``ex`` itself, unless its Session's state was lost: then SessionLostError."""
    if ex.state_lost:
        lost = errors.SessionLostError(session, "Lost", "InterpreterRestarted",
                                       ex.error.value if ex.error else "the interpreter died")
        lost.execution = ex
        raise lost
    return ex


def lookup(sb, req, handlers, cause):
    """What became of run ``req`` of Sandbox ``sb`` whose answer was lost
    (``cause``): its stored result, or the rest of its stream by attaching to
    it; ``NotRunError`` when its agent never had it (it may be sent again)."""
    unknown_until = time.monotonic() + RECOVER_GRACE
    give_up = time.monotonic() + RECOVER_TIMEOUT
    while time.monotonic() < give_up:
        try:
            info = _api.request_json(sb._api, "GET", sb._path("executions"), query={"id": req["id"]},
                                     timeout=ASK_TIMEOUT)
        except errors.APIError as e:
            if e.status == 404 and time.monotonic() > unknown_until:
                raise errors.NotRunError(sb.name, cause) from None
            if e.status == 409:
                phase = ((sb.get().get("status") or {}).get("phase")) or "Pending"
                if phase == "Pending":
                    raise errors.NotRunError(sb.name, cause) from None
                raise errors.WarmpoolError(f"the answer of run {req['id']} was lost and its Session {sb.name} "
                                           f"is {phase}: whether the code ran is unknown ({cause})") from None
        except (urllib3.exceptions.HTTPError, OSError):
            pass
        else:
            if info.get("running"):
                # It runs: the same ID attaches to it, and never runs it again.
                exec_req = {k: v for k, v in req.items() if k not in ("pool", "waitMillis")}
                try:
                    resp = _api.request(sb._api, "POST", sb._path("exec"), body=exec_req, accept="application/x-ndjson")
                except errors.APIError as e:
                    if e.status not in (502, 503):
                        raise
                    # The API server's proxy still chose the replica that went
                    # away; nothing streamed: ask again through another one.
                    time.sleep(0.1)
                    continue
                return sb._read_stream(resp, req["id"], *handlers)
            if info.get("result") is not None:
                return lost_state(sb.name, Execution.from_result(info["result"]))
        time.sleep(0.1)
    raise errors.WarmpoolError(f"the answer of run {req['id']} was lost, and asking about it did not succeed "
                               f"within {RECOVER_TIMEOUT:.0f}s ({cause})")
