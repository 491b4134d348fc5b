"""The RLM REPL session on a warmpool Session.

``REPLSession(chunk_store, llm_client, max_iterations=10, timeout_seconds=60)``
runs the model's code in a warm, gVisor-isolated interpreter of a pool and
keeps what it needs on the caller's side: the chunk store and the model
client. Inside the sandbox the code finds

- ``llm_query(prompt, context=None)``: the caller's model, one iteration per
  call; past ``max_iterations`` the call raises ``RuntimeError`` naming the
  limit;
- ``read_chunk(chunk_id)``, ``search_chunks(query, limit=10)``,
  ``list_chunks_by_tag(tag)``, ``get_linked_chunks(chunk_id, link_type=None)``:
  the caller's chunk store, reached through the data plane's bridge (the
  sandbox has no network and never holds the store);
- ``state``, a dict that persists across iterations;
- ``FINAL(answer)``, once per session.

The in-process session it replaces guarded Python itself (no ``os``,
``open``, ``eval``...); here the boundary is the sandbox: gVisor, no network,
a pod of its own, so the code may use Python fully.

    with REPLSession(store, client, pool="python") as repl:
        out = repl.execute("hits = search_chunks('deadline')\\nFINAL(read_chunk(hits[0])['text'])")
        print(out["result"], repl.get_result())
"""

import time
from typing import Optional

from . import errors
from .sandbox import MEMORY_METHODS, Sandbox


class MaxIterationsExceeded(RuntimeError):
    """llm_query was called more than max_iterations times in a session."""


def _model(llm_client):
    """The function that asks the model: the client itself when callable,
    else its complete / generate / query method."""
    for name in ("complete", "generate", "query"):
        fn = getattr(llm_client, name, None)
        if callable(fn):
            return fn
    if callable(llm_client):
        return llm_client
    raise TypeError("llm_client must be callable or have a complete(prompt), generate(prompt) or query(prompt) method")


def _memory(chunk_store):
    """The four memory functions over the caller's store: its own methods of
    those names, else a mapping of chunk id -> chunk dict searched here."""
    own = {m: getattr(chunk_store, m) for m in MEMORY_METHODS if callable(getattr(chunk_store, m, None))}
    if len(own) == len(MEMORY_METHODS):
        return own
    if not hasattr(chunk_store, "items"):
        raise TypeError(f"chunk_store must have the methods {', '.join(MEMORY_METHODS)} or be a mapping of chunk id to chunk")

    def read_chunk(chunk_id):
        c = chunk_store.get(chunk_id)
        return dict(c, id=chunk_id) if isinstance(c, dict) and "id" not in c else c

    def search_chunks(query, limit=10):
        q = str(query).lower()
        hits = [cid for cid, c in chunk_store.items() if q in str((c or {}).get("text", "")).lower()]
        return hits[:max(int(limit), 0)]

    def list_chunks_by_tag(tag):
        return [read_chunk(cid) for cid, c in chunk_store.items() if tag in ((c or {}).get("tags") or [])]

    def get_linked_chunks(chunk_id, link_type=None):
        c = chunk_store.get(chunk_id) or {}
        out = []
        for link in c.get("links") or []:
            target, kind = (link.get("id"), link.get("type")) if isinstance(link, dict) else (link, None)
            if (link_type is None or kind == link_type) and target in chunk_store:
                out.append(read_chunk(target))
        return out

    return {**{"read_chunk": read_chunk, "search_chunks": search_chunks, "list_chunks_by_tag": list_chunks_by_tag,
               "get_linked_chunks": get_linked_chunks}, **own}


class REPLSession:
    """One RLM REPL session: a warmpool Session leased at construction and
    closed by ``close()`` (or the ``with`` block).

    ``execute(code)`` returns a dict: ``success``, ``output`` (stdout),
    ``stderr``, ``error`` and ``error_type`` (``SyntaxError``,
    ``TimeoutError``, ``MaxIterationsExceeded``, the exception's class...),
    ``result`` (the FINAL answer, else the last expression's repr),
    ``final``, ``iteration_count``, ``execution_time`` (seconds).
    """

    def __init__(self, chunk_store, llm_client, max_iterations: int = 10, timeout_seconds: float = 60, *,
                 pool: str = "python", namespace: Optional[str] = None, **sandbox_kwargs):
        if chunk_store is None:
            raise ValueError("REPLSession needs a chunk_store")
        if llm_client is None:
            raise ValueError("REPLSession needs an llm_client")
        if max_iterations < 1:
            raise ValueError("max_iterations must be at least 1")
        self.chunk_store, self.llm_client = chunk_store, llm_client
        self.max_iterations, self.timeout_seconds = int(max_iterations), timeout_seconds
        self.iteration_count = 0
        self._model = _model(llm_client)
        self._memory = _memory(chunk_store)
        self._result: Optional[str] = None
        self.sandbox = Sandbox.create(pool, namespace, **sandbox_kwargs)
        try:
            ex = self.sandbox.run_code("state = {}")
            if not ex.ok:
                raise errors.WarmpoolError(f"starting the session failed: {ex.error}")
        except BaseException:
            self.sandbox.close()
            raise

    def _llm_query(self, prompt):
        if self.iteration_count >= self.max_iterations:
            raise MaxIterationsExceeded(f"max_iterations ({self.max_iterations}) exceeded: llm_query was called "
                                        f"{self.max_iterations} times in this session")
        self.iteration_count += 1
        return str(self._model(prompt))

    def _rlm_query(self, task, context):
        prompt = task if context is None else f"{task}\n\nContext:\n{context}"
        return self._llm_query(prompt)

    def execute(self, query: str) -> dict:
        """Run one block of the model's code in the session."""
        start = time.monotonic()
        ex = self.sandbox.run_code(query, timeout=self.timeout_seconds, on_llm_query=self._llm_query,
                                   on_rlm_query=self._rlm_query, on_call=self._memory,
                                   max_bridge_calls=max(self.max_iterations + 1, 64))
        out = {"success": ex.ok, "output": ex.stdout, "stderr": ex.stderr, "error": None, "error_type": None,
               "result": ex.text, "final": ex.final, "iteration_count": self.iteration_count,
               "execution_time": time.monotonic() - start}
        if ex.final:
            self._result = ex.text
        if ex.error is not None:
            kind, message = ex.error.name, ex.error.value
            if ex.status == "timed_out":
                kind, message = "TimeoutError", f"the code ran longer than timeout_seconds ({self.timeout_seconds} s)"
            elif "MaxIterationsExceeded" in message:
                kind = "MaxIterationsExceeded"
            out["error_type"] = kind
            out["error"] = ex.error.traceback.strip() if ex.error.traceback and kind != "TimeoutError" else f"{kind}: {message}"
        return out

    def get_state(self) -> dict:
        """The session's ``state`` dict, as JSON values."""
        return self.sandbox.get_variable("state")

    def get_result(self) -> Optional[str]:
        """The answer FINAL gave, or None before it."""
        return self._result

    def close(self):
        self.sandbox.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"REPLSession(session={self.sandbox.name!r}, iterations={self.iteration_count}/{self.max_iterations}, "
                f"result={self._result!r})")


__all__ = ["REPLSession", "MaxIterationsExceeded"]
