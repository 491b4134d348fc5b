"""What a run of code returns: the shape code-interpreter SDKs use."""

import base64
from dataclasses import dataclass, field
from typing import Any, Optional

# A rich result's attributes and their MIME types (E2B's names).
_FORMATS = (("text", "text/plain"), ("html", "text/html"), ("markdown", "text/markdown"), ("svg", "image/svg+xml"),
            ("png", "image/png"), ("jpeg", "image/jpeg"), ("pdf", "application/pdf"), ("latex", "text/latex"),
            ("json", "application/json"), ("javascript", "application/javascript"))


class Result:
    """One rich result of a run: what ``display(obj)`` showed, a matplotlib
    figure, or the last expression's rich forms (``is_main_result``). The
    attributes are E2B's: ``text`` (always), ``html``, ``markdown``,
    ``svg``, ``png`` and ``jpeg`` (base64 strings), ``pdf``, ``latex``,
    ``json``, ``javascript``; ``formats()`` names those present besides
    text; ``data`` is the whole MIME bundle; ``omitted`` the MIME types a
    size limit left out. Jupyter shows it as the sandbox did."""

    def __init__(self, data=None, is_main_result=False, omitted=()):
        self.data = dict(data or {})
        self.is_main_result = bool(is_main_result)
        self.omitted = list(omitted or ())

    @classmethod
    def from_display(cls, d):
        return cls(d.get("data") or {}, d.get("main", False), d.get("omitted") or ())

    def __getattr__(self, name):
        if name == "data":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        for attr, mime in _FORMATS:
            if attr == name:
                return self.data.get(mime)
        raise AttributeError(name)

    def formats(self):
        """The formats present besides text, by E2B's names ("png", "html"...)."""
        return [attr for attr, mime in _FORMATS if attr != "text" and mime in self.data]

    def _bytes(self, mime):
        v = self.data.get(mime)
        return base64.b64decode(v) if v is not None else None

    def _repr_png_(self):
        return self._bytes("image/png")

    def _repr_jpeg_(self):
        return self._bytes("image/jpeg")

    def _repr_html_(self):
        return self.data.get("text/html")

    def _repr_markdown_(self):
        return self.data.get("text/markdown")

    def _repr_svg_(self):
        return self.data.get("image/svg+xml")

    def _repr_latex_(self):
        return self.data.get("text/latex")

    def _repr_json_(self):
        return self.data.get("application/json")

    def __str__(self):
        return self.data.get("text/plain") or ""

    def __repr__(self):
        main = ", main" if self.is_main_result else ""
        return f"Result({', '.join(['text'] + self.formats())}{main})"


@dataclass
class FileChange:
    """A file of the workspace the run created (``created``) or changed:
    its ``path`` from the workspace's root (``sandbox.files.read(path)``
    fetches it) and ``size`` in bytes."""

    path: str
    size: int = 0
    created: bool = False


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
    ``interrupted`` or ``timed_out``; ``duration`` is in seconds;
    ``results`` are the rich results (charts, tables, ``display()``) in
    order; ``files`` the workspace files the run created or changed;
    ``resumed`` says the Session was suspended and resumed, with its state,
    for this run; ``moved`` (``fromNode``, ``toNode``, ``reason``, ``since``,
    ``run``, ``checkpoint``) that it moved to another node since its previous
    run (said once): with its state, off a drained one, or, when
    ``checkpoint`` is set, from its last checkpoint after its pod or node
    was lost: its state is as after run number ``run``, and the runs after
    it are to be redone; ``run`` is this run's number in the Session.
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
    results: list = field(default_factory=list)
    files: list = field(default_factory=list)
    resumed: bool = False
    moved: Optional[dict] = None
    run: int = 0
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
            state_lost=bool(r.get("stateLost")), resumed=bool(r.get("resumed")), moved=r.get("moved"), run=int(r.get("run", 0)), raw=r,
            results=[Result.from_display(d) for d in r.get("displays") or []],
            files=[FileChange(f.get("path", ""), int(f.get("size", 0)), bool(f.get("created"))) for f in r.get("files") or []],
            error=ExecutionError(err.get("type", ""), err.get("message", ""), err.get("traceback", "")) if err else None,
        )
