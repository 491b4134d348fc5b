"""An RLM environment backed by a warmpool Session.

The shape of the reference Recursive Language Model implementation's
environments (``setup`` / ``load_context`` / ``execute_code``): the model's
code runs in a warm, isolated interpreter where ``context`` holds the loaded
payload and ``llm_query(prompt)``, ``rlm_query(task, ctx)``, ``FINAL(answer)``,
``FINAL_VAR(name)`` and ``chunk_text(text, size, overlap)`` are defined.
``llm_query`` and ``rlm_query`` are answered here, by the host's model
client, through the data plane's bridge: the sandbox itself needs no egress
and never sees an API key.

    env = WarmpoolREPL("python", "team-a", llm_query=my_model)
    env.setup()
    env.load_context(open("book.txt").read())
    r = env.execute_code("FINAL(llm_query('Summarise: ' + context[:5000]))")
    print(r.final_answer)
    env.cleanup()
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .sandbox import Sandbox

# Helpers the environment adds to the interpreter next to the sandbox's own
# (context, llm_query, rlm_query, FINAL, chunk_text).
_HELPERS = '''
def FINAL_VAR(name):
    """Ends the run with the value of the global `name` as the answer."""
    if name not in globals():
        raise NameError(f"FINAL_VAR: no variable named {name!r}")
    FINAL(globals()[name])


def SHOW_VARS():
    """The names and types of the variables defined so far."""
    return {k: type(v).__name__ for k, v in globals().items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}
'''


@dataclass
class REPLResult:
    """What one ``execute_code`` did: output, the answer when the code called
    ``FINAL``/``FINAL_VAR``, the model calls it made, the error it raised."""

    stdout: str
    stderr: str
    execution_time: float
    result: Optional[str] = None
    final_answer: Optional[str] = None
    error: Optional[str] = None
    llm_calls: list = field(default_factory=list)

    def __str__(self):
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.error:
            parts.append(self.error)
        elif self.result is not None and self.final_answer is None:
            parts.append(self.result)
        return "\n".join(p.rstrip("\n") for p in parts if p)


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
        self._sandbox_kwargs = dict(sandbox_kwargs)
        if idle_timeout is not None:
            self._sandbox_kwargs["timeout"] = idle_timeout
        self.sandbox: Optional[Sandbox] = None

    def setup(self):
        """Lease the interpreter and define the RLM helpers in it."""
        if self.sandbox is None:
            self.sandbox = Sandbox.create(self.pool, self.namespace, **self._sandbox_kwargs)
            ex = self.sandbox.run_code(_HELPERS)
            if not ex.ok:
                raise RuntimeError(f"defining the RLM helpers failed: {ex.error}")

    def load_context(self, context_payload):
        """Make ``context`` the payload (a str, dict or list: anything JSON)."""
        self.setup()
        ex = self.sandbox.run_code("None", context=context_payload)
        if not ex.ok:
            raise RuntimeError(f"loading the context failed: {ex.error}")

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
        return REPLResult(stdout=ex.stdout, stderr=ex.stderr, execution_time=time.monotonic() - start,
                          result=ex.text, final_answer=ex.text if ex.final else None, error=error, llm_calls=calls)

    def cleanup(self):
        """Close the Session: its interpreter and files are gone."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False
