"""warmpool: stateful, interruptible Python sandboxes on Kubernetes.

    from warmpool import Sandbox
    with Sandbox.create(pool="python", namespace="team-a") as sb:
        sb.run_code("x = 6 * 7")
        print(sb.run_code("x").text)  # 42
"""

from .errors import (APIError, ForbiddenError, NotFoundError, PoolNotFoundError, SessionLostError, TimeoutError,
                     WarmpoolError)
from .execution import Execution, ExecutionError
from .oneoff import run
from .sandbox import Files, Sandbox

__all__ = ["run", "Sandbox", "Files", "Execution", "ExecutionError", "WarmpoolError", "APIError", "ForbiddenError",
           "NotFoundError", "PoolNotFoundError", "SessionLostError", "TimeoutError"]
