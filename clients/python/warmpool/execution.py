"""What a run of code returns: the shape code-interpreter SDKs use."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ExecutionError:
    """An exception the code raised (or the sandbox's own end of the run:
    ``KeyboardInterrupt`` at an interrupt or timeout, ``InterpreterKilled``...)."""

    name: str
    value: str
    traceback: str = ""


@dataclass
class Execution:
    """The outcome of one run.

    ``text`` is the repr of the last expression's value (or of ``FINAL(x)``),
    ``None`` when there was none; ``status`` is ``succeeded``, ``failed``,
    ``interrupted`` or ``timed_out``; ``duration`` is in seconds.
    """

    id: str
    status: str
    stdout: str = ""
    stderr: str = ""
    text: Optional[str] = None
    error: Optional[ExecutionError] = None
    final: bool = False
    duration: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    state_lost: bool = False
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def result(self) -> Optional[str]:
        """The same as ``text``."""
        return self.text

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def to_json(self) -> dict[str, Any]:
        """The run as the JSON a tool-calling model reads: result, stdout,
        stderr and, when it failed, the error."""
        out = {"result": self.text, "stdout": self.stdout, "stderr": self.stderr}
        if self.error is not None:
            out["error"] = {"name": self.error.name, "value": self.error.value, "traceback": self.error.traceback}
        return out

    @classmethod
    def from_result(cls, r: dict) -> "Execution":
        err = r.get("error")
        return cls(
            id=r.get("id", ""), status=r.get("status", ""), stdout=r.get("stdout", ""), stderr=r.get("stderr", ""),
            text=r.get("result"), final=bool(r.get("final")), duration=float(r.get("durationMillis", 0)) / 1000,
            stdout_truncated=bool(r.get("stdoutTruncated")), stderr_truncated=bool(r.get("stderrTruncated")),
            state_lost=bool(r.get("stateLost")), raw=r,
            error=ExecutionError(err.get("type", ""), err.get("message", ""), err.get("traceback", "")) if err else None,
        )
