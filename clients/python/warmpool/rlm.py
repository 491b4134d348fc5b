"""An RLM environment backed by a warmpool Session.

The reference Recursive Language Model implementation's environment
contract: ``setup`` / ``load_context`` / ``execute_code`` returning a
``REPLResult(stdout, stderr, locals, execution_time, rlm_calls,
final_answer)``, and its optional persistence protocol (``add_context`` /
``add_history`` with versioned ``context_0…`` and ``history_0…``). The
model's code runs in a warm, isolated interpreter where ``context`` holds the
loaded payload and ``llm_query(prompt)``, ``llm_query_batched(prompts)``,
``rlm_query(task, ctx)``, ``rlm_query_batched(tasks)``, ``FINAL(answer)``,
``FINAL_VAR(name)``, ``SHOW_VARS()`` and ``chunk_text(text, size, overlap)``
are defined. The queries are answered here, by the host's model client,
through the data plane's bridge: the sandbox itself needs no egress and never
sees an API key.

    env = WarmpoolREPL("python", "team-a", llm_query=my_model)
    env.setup()
    env.load_context(open("book.txt").read())
    r = env.execute_code("FINAL(llm_query('Summarise: ' + context[:5000]))")
    print(r.final_answer)
    env.cleanup()

The reference RLM picks its environment from a fixed list (no plug-in
point); ``register()`` adds ``"warmpool"`` to it:

    import warmpool.rlm; warmpool.rlm.register()
    RLM(..., environment="warmpool", environment_kwargs={"pool": "python", "llm_query": my_model})
"""

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .sandbox import Sandbox

# Helpers the environment adds to the interpreter next to the sandbox's own
# (context, llm_query(_batched), rlm_query(_batched), FINAL, FINAL_VAR, chunk_text).
_HELPERS = '''
def SHOW_VARS():
    """The names and types of the variables defined so far."""
    return {k: type(v).__name__ for k, v in globals().items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def _warmpool_locals(limit=4096):
    """The user's variables as JSON values, or their repr (cut at `limit`) when they are not JSON."""
    import json as _json
    out = {}
    for k, v in list(globals().items()):
        if k.startswith("_") or callable(v) or type(v).__name__ == "module":
            continue
        try:
            text = _json.dumps(v)
            out[k] = v if len(text) <= limit else text[:limit] + "..."
        except (TypeError, ValueError):
            r = repr(v)
            out[k] = r if len(r) <= limit else r[:limit] + "..."
    return out
'''


class LazyLocals(Mapping):
    """The interpreter's variables, read on first use (an iteration that never
    looks costs no round trip): JSON values where they serialise, else their
    repr. A snapshot of when it is first read, not of the end of the run."""

    def __init__(self, sandbox):
        self._sandbox, self._data = sandbox, None

    def _load(self):
        if self._data is None:
            if self._sandbox is None:
                self._data = {}
            else:
                ex = self._sandbox.run_code("_warmpool_vars = _warmpool_locals()")
                self._data = self._sandbox.get_variable("_warmpool_vars") if ex.ok else {}
        return self._data

    def __getitem__(self, k):
        return self._load()[k]

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())

    def __repr__(self):
        return repr(self._load())


@dataclass
class REPLResult:
    """What one ``execute_code`` did: output, the user's variables
    (``locals``), the time it took, the model calls it made (``rlm_calls``),
    the answer when the code called ``FINAL``/``FINAL_VAR``, and warmpool's
    additions: the last expression's repr (``result``) and the error raised."""

    stdout: str
    stderr: str
    locals: Mapping = field(default_factory=dict)
    execution_time: float = 0.0
    rlm_calls: list = field(default_factory=list)
    final_answer: Optional[str] = None
    result: Optional[str] = None
    error: Optional[str] = None

    @property
    def llm_calls(self):
        """The same as ``rlm_calls``."""
        return self.rlm_calls

    def __str__(self):
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.error:
            parts.append(self.error)
        elif self.result is not None and self.final_answer is None:
            parts.append(self.result)
        return "\n".join(p.rstrip("\n") for p in parts if p)


# Keyword arguments the reference RLM passes to every environment; a Session
# needs none of them (llm_query comes over the bridge, not from a handler address).
_RLM_KWARGS = ("lm_handler_address", "persistent", "depth", "max_concurrent_subcalls", "context_payload", "setup_code")


class WarmpoolREPL:
    """A persistent REPL for an RLM, one warmpool Session per environment.

    ``llm_query(prompt) -> str`` answers the code's ``llm_query`` calls;
    ``rlm_query(task, context) -> str`` its recursive sub-tasks (without it,
    ``rlm_query`` falls back to ``llm_query`` on the task). ``timeout``
    (seconds) bounds each ``execute_code``; the rest goes to
    ``Sandbox.create`` (``kubeconfig``, ``timeout`` of idleness as
    ``idle_timeout``...).
    """

    def __init__(self, pool: str, namespace: Optional[str] = None, *, llm_query: Callable[[str], str],
                 rlm_query: Optional[Callable[[str, Any], str]] = None, timeout: Optional[float] = None,
                 idle_timeout: Optional[int] = None, max_llm_calls: Optional[int] = None, **sandbox_kwargs):
        self.pool, self.namespace = pool, namespace
        self._llm_query, self._rlm_query = llm_query, rlm_query
        self.timeout, self.max_llm_calls = timeout, max_llm_calls
        rlm_kwargs = {k: sandbox_kwargs.pop(k) for k in _RLM_KWARGS if k in sandbox_kwargs}
        self.persistent = bool(rlm_kwargs.get("persistent"))
        self._sandbox_kwargs = dict(sandbox_kwargs)
        if idle_timeout is not None:
            self._sandbox_kwargs["timeout"] = idle_timeout
        self.sandbox: Optional[Sandbox] = None
        self._contexts: set = set()
        self._histories: set = set()
        self._setup_code = rlm_kwargs.get("setup_code")
        if rlm_kwargs.get("context_payload") is not None:
            self.load_context(rlm_kwargs["context_payload"])

    def setup(self):
        """Lease the interpreter and define the RLM helpers in it."""
        if self.sandbox is None:
            self.sandbox = Sandbox.create(self.pool, self.namespace, **self._sandbox_kwargs)
            for code in (_HELPERS, self._setup_code):
                if code:
                    ex = self.sandbox.run_code(code)
                    if not ex.ok:
                        raise RuntimeError(f"setting up the environment failed: {ex.error}")

    def load_context(self, context_payload):
        """Make ``context`` (and ``context_0``) the payload: a str, dict or list, anything JSON."""
        self.add_context(context_payload, 0)

    def execute_code(self, code: str) -> REPLResult:
        """Run the model's code; its variables stay for the next call."""
        self.setup()
        calls = []

        def llm(prompt):
            calls.append({"method": "llm_query", "prompt": prompt})
            return self._llm_query(prompt)

        def rlm(task, ctx):
            calls.append({"method": "rlm_query", "task": task})
            return self._rlm_query(task, ctx) if self._rlm_query else self._llm_query(task)

        start = time.monotonic()
        ex = self.sandbox.run_code(code, timeout=self.timeout, on_llm_query=llm, on_rlm_query=rlm,
                                   max_bridge_calls=self.max_llm_calls)
        error = None
        if ex.error is not None:
            error = ex.error.traceback or f"{ex.error.name}: {ex.error.value}"
        return REPLResult(stdout=ex.stdout, stderr=ex.stderr, locals=LazyLocals(self.sandbox),
                          execution_time=time.monotonic() - start, rlm_calls=calls,
                          final_answer=ex.text if ex.final else None, result=ex.text, error=error)

    # -- the persistence protocol (SupportsPersistence) --------------------

    def update_handler_address(self, address) -> None:
        """Part of the protocol; nothing to do: the code's queries come back over the data plane."""

    def add_context(self, context_payload, context_index: Optional[int] = None) -> int:
        """Set ``context_N`` (the next N unless given) and ``context``, the
        alias of the latest; returns N."""
        self.setup()
        index = self._next(self._contexts) if context_index is None else int(context_index)
        ex = self.sandbox.run_code(f"context_{index} = context", context=context_payload)
        if not ex.ok:
            raise RuntimeError(f"loading context_{index} failed: {ex.error}")
        self._contexts.add(index)
        return index

    def get_context_count(self) -> int:
        return len(self._contexts)

    def add_history(self, message_history, history_index: Optional[int] = None) -> int:
        """Set ``history_N`` to a copy of the messages (the next N unless
        given); ``history`` is the alias of ``history_0``. Returns N."""
        self.setup()
        index = self._next(self._histories) if history_index is None else int(history_index)
        data = json.dumps(message_history)  # a copy: the caller may change its list afterwards
        ex = self.sandbox.run_code(
            f"import json as _json\nhistory_{index} = _json.loads({data!r})\n"
            f"if {index} == 0 or 'history' not in globals():\n    history = history_{index}")
        if not ex.ok:
            raise RuntimeError(f"loading history_{index} failed: {ex.error}")
        self._histories.add(index)
        return index

    def get_history_count(self) -> int:
        return len(self._histories)

    @staticmethod
    def _next(used):
        return max(used) + 1 if used else 0

    def cleanup(self):
        """Close the Session: its interpreter and files are gone."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        self._contexts.clear()
        self._histories.clear()

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False


def register(module=None):
    """Teach the reference RLM ``environment="warmpool"``.

    Its ``get_environment`` is a fixed list, imported by name into the module
    that builds environments (``rlm.core.rlm``): both names are wrapped, so
    ``RLM(environment="warmpool", environment_kwargs={"pool": ...,
    "llm_query": ...})`` builds a WarmpoolREPL and every other environment is
    built as before. ``module`` is that module (default: imported)."""
    if module is None:
        import importlib
        module = importlib.import_module("rlm.core.rlm")
    targets = [module]
    try:
        import importlib
        targets.append(importlib.import_module("rlm.environments"))
    except ImportError:
        pass
    for target in targets:
        original = getattr(target, "get_environment", None)
        if original is None or getattr(original, "_warmpool", False):
            continue

        def get_environment(environment, environment_kwargs, _original=original):
            if environment == "warmpool":
                kwargs = dict(environment_kwargs or {})
                if "llm_query" not in kwargs:
                    raise ValueError("environment 'warmpool' needs environment_kwargs['llm_query']: the function that "
                                     "answers the code's llm_query calls (the data plane brings them back here)")
                return WarmpoolREPL(kwargs.pop("pool", "python"), kwargs.pop("namespace", None), **kwargs)
            return _original(environment, environment_kwargs)

        get_environment._warmpool = True
        target.get_environment = get_environment
