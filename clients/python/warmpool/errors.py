"""Errors of the warmpool client. Each says what happened and what to do."""


class WarmpoolError(Exception):
    """Base of every error this package raises."""


class APIError(WarmpoolError):
    """The API server or the data plane refused a request.

    ``status`` is the HTTP status, ``reason`` Kubernetes' reason (``Forbidden``,
    ``NotFound``, ``Conflict``...), ``message`` the server's explanation.
    """

    def __init__(self, status, reason, message):
        self.status, self.reason, self.message = status, reason, message
        # Status 0 and no message: no HTTP answer came (the kubernetes client's
        # TLS and connection failures), and its reason says why.
        head = " ".join(str(p) for p in (status or "", reason) if p)
        super().__init__(f"{head}: {message}" if message else head)


class ForbiddenError(APIError):
    """RBAC does not let this user do it; the message names the verb needed
    (for example ``create`` on ``sessions/exec`` in ``data.warmpool.dev``)."""


class NotFoundError(APIError):
    """The Session (or the variable, the file) does not exist."""


class PoolNotFoundError(WarmpoolError):
    """The SandboxPool named does not exist in the namespace: create it, or name another."""


class SessionLostError(WarmpoolError):
    """The Session ended (closed, idle timeout, maximum lifetime) or lost its
    interpreter: its state is gone. Create a new Sandbox."""

    def __init__(self, name, phase, reason, message):
        self.name, self.phase, self.reason = name, phase, reason
        super().__init__(f"Session {name} is {phase} ({reason}: {message}): create a new Sandbox")


class TimeoutError(WarmpoolError):  # noqa: A001 - the package's own, a subclass of WarmpoolError
    """A wait ran out: the Session did not become Ready, or an Execution did not finish, in time."""


class StreamCutError(WarmpoolError):
    """A run's stream ended before its result: the Session's pod or the data
    plane replica that relayed it went away. Whether the code ran is for the
    caller to ask (the run's ID); ``warmpool.run`` asks itself."""


class NotRunError(WarmpoolError):
    """The code did not run (no sandbox came in time, the request was
    refused, or its answer was lost before the code was sent): sending it
    again cannot run it twice. ``cause`` is what stopped it."""

    def __init__(self, session, cause):
        self.session, self.cause = session, cause
        super().__init__(f"the code did not run (Session {session}): {cause}")
