"""warmpool: stateful, interruptible Python sandboxes on Kubernetes.

    from warmpool import Sandbox
    with Sandbox.create(pool="python", namespace="team-a") as sb:
        sb.run_code("x = 6 * 7")
        print(sb.run_code("x").text)  # 42
"""

from .errors import (APIError, ForbiddenError, NotFoundError, NotRunError, PoolNotFoundError, SessionLostError,
                     StreamCutError, TimeoutError, WarmpoolError)
from .execution import Execution, ExecutionError, FileChange, Result
from .oneoff import run
from .replsession import MaxIterationsExceeded, REPLSession
from .rlm import REPLResult, WarmpoolREPL
from .sandbox import EntryInfo, Files, Sandbox
from .snapshot import Snapshot
from .tools import python_tool

__all__ = ["run", "python_tool", "WarmpoolREPL", "REPLResult", "REPLSession", "MaxIterationsExceeded", "Sandbox", "Snapshot", "Files", "EntryInfo", "Execution", "ExecutionError", "Result", "FileChange", "WarmpoolError", "APIError", "ForbiddenError",
           "NotFoundError", "NotRunError", "PoolNotFoundError", "SessionLostError", "StreamCutError", "TimeoutError"]
