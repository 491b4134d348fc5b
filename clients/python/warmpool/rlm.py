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

import ast
import importlib.resources
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from . import errors
from .sandbox import Sandbox

# The names the reference RLM reserves in its REPL, put back after every cell
# that rebound them (with FINAL and FINAL_VAR): see _rlm_scaffold.py.
RESERVED_NAMES = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS", "answer",
                  "context", "history")


def _scaffold():
    return importlib.resources.files(__package__).joinpath("_rlm_scaffold.py").read_text()


class LazyLocals(Mapping):
    """The interpreter's variables, read on first use (an iteration that never
    looks costs no round trip): JSON values where they serialise, else their
    repr cut at 4096 characters. A snapshot of when it is first read, not of
    the end of the run."""

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


class SandboxLocals(Mapping):
    """The interpreter's variables as they are now, each read whole when it is
    looked up (``env.locals["history_0"]``): a JSON value, or the repr of one
    that is not JSON. Nothing is cached: a later ``add_context`` or run shows."""

    def __init__(self, env):
        self._env = env

    def __getitem__(self, k):
        sandbox = self._env.sandbox
        if sandbox is None or not isinstance(k, str) or k.startswith("_") or k == "answer":
            raise KeyError(k)
        try:
            return sandbox.get_variable(k)
        except errors.NotFoundError:
            raise KeyError(k) from None
        except ValueError as e:  # not JSON: its repr, as the reference shows non-JSON values
            return str(e).split(": ", 1)[-1]

    def __iter__(self):
        sandbox = self._env.sandbox
        if sandbox is None:
            return iter(())
        ex = sandbox.run_code("_warmpool_vars = _warmpool_names()")
        return iter(sandbox.get_variable("_warmpool_vars") if ex.ok else ())

    def __len__(self):
        return sum(1 for _ in self)

    def __repr__(self):
        return repr(dict(self.items()))


@dataclass
class REPLResult:
    """What one ``execute_code`` did: output, the user's variables
    (``locals``), the time it took, the model calls it made (``rlm_calls``),
    the answer when the code ended its completion (``answer["ready"] = True``,
    ``FINAL``, ``FINAL_VAR``), and warmpool's additions: the last expression's
    repr (``result``) and the error raised. The error's traceback is in
    ``stderr`` too, where the reference RLM shows the model what went wrong."""

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

    def to_dict(self):
        """A JSON-able dict of the result (what the reference RLM's logger writes)."""
        calls = [c.to_dict() if hasattr(c, "to_dict") else (asdict(c) if hasattr(c, "__dataclass_fields__") else c)
                 for c in self.rlm_calls]
        return {"stdout": self.stdout, "stderr": self.stderr, "locals": {k: _simple(v) for k, v in self.locals.items()},
                "execution_time": self.execution_time, "rlm_calls": calls, "final_answer": self.final_answer,
                "result": self.result, "error": self.error}

    def __str__(self):
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.error and self.error not in self.stderr:
            parts.append(self.error)
        elif self.result is not None and self.final_answer is None and not self.error:
            parts.append(self.result)
        return "\n".join(p.rstrip("\n") for p in parts if p)


def _tool_value(tool):
    """A custom tool's value: the reference gives a tool as itself or as {"tool": ..., "description": ...}."""
    return tool.get("tool") if isinstance(tool, dict) and "tool" in tool else tool


def _simple(v):
    return v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else repr(v)


# Keyword arguments the reference RLM passes to its environments; a Session
# needs none of them at its creation.
_RLM_KWARGS = ("lm_handler_address", "persistent", "depth", "max_concurrent_subcalls", "context_payload", "setup_code",
               "compaction", "custom_tools", "custom_sub_tools", "subcall_fn")

# What the model is told when its code ended the interpreter (and so the Session).
_RESTARTED = ("The interpreter ended, and with it every variable and context: the next code runs in a fresh "
              "sandbox.\n")

# A cell that names none of these can neither give an answer nor rebind a
# scaffold name: no second round trip after it.
_AFTER_NAMES = RESERVED_NAMES + ("FINAL", "globals", "exec", "eval", "setattr", "__dict__", "vars")


class WarmpoolREPL:
    """A persistent REPL for an RLM, one warmpool Session per environment.

    The code's ``llm_query`` calls come back here over the data plane's
    bridge and are answered by ``llm_query(prompt) -> str`` when given, else
    by the reference RLM's own model (its LM handler at
    ``lm_handler_address``, which the RLM passes; the sandbox never reaches
    it). ``rlm_query`` calls go to ``rlm_query(task, context) -> str``, else
    to the RLM's ``subcall_fn``, else to ``llm_query``. ``timeout`` (seconds)
    bounds each ``execute_code``; the rest goes to ``Sandbox.create``
    (``kubeconfig``, ``idle_timeout``...). ``compaction``: ``True`` gives the
    code ``history`` as the list the RLM appends its compaction entries to;
    ``None`` (the default) turns that on at the RLM's first entry (it passes
    ``compaction`` only to its own environments); ``False`` ignores them.
    """

    def __init__(self, pool: str = "python", namespace: Optional[str] = None, *,
                 llm_query: Optional[Callable[[str], str]] = None,
                 rlm_query: Optional[Callable[[str, Any], str]] = None, timeout: Optional[float] = None,
                 idle_timeout: Optional[int] = None, max_llm_calls: Optional[int] = None, **sandbox_kwargs):
        self.pool, self.namespace = pool, namespace
        self._llm_query, self._rlm_query = llm_query, rlm_query
        self.timeout, self.max_llm_calls = timeout, max_llm_calls
        rlm_kwargs = {k: sandbox_kwargs.pop(k) for k in _RLM_KWARGS if k in sandbox_kwargs}
        self.persistent = bool(rlm_kwargs.get("persistent"))
        self.lm_handler_address = rlm_kwargs.get("lm_handler_address")
        self.depth = int(rlm_kwargs.get("depth") or 1)
        self.compaction = rlm_kwargs.get("compaction")
        self._subcall_fn = rlm_kwargs.get("subcall_fn")
        self._tools = {**(rlm_kwargs.get("custom_tools") or {})}
        for name in self._tools:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"custom tool {name!r} is not a Python name")
            if name in RESERVED_NAMES or name in ("FINAL", "FINAL_VAR"):
                raise ValueError(f"custom tool {name!r} would replace the REPL's own {name}: choose another name")
            if callable(_tool_value(self._tools[name])):
                raise TypeError(f"custom tool {name!r} is a function of this process; a warmpool sandbox can hold only "
                                f"JSON values and Python source (a str starting with 'def {name}(')")
        self._sandbox_kwargs = dict(sandbox_kwargs)
        if idle_timeout is not None:
            self._sandbox_kwargs["timeout"] = idle_timeout
        self.sandbox: Optional[Sandbox] = None
        self.locals = SandboxLocals(self)
        self._contexts: set = set()
        self._histories: set = set()
        self._turn_pending = False
        self._calls_made: list = []
        self._setup_code = rlm_kwargs.get("setup_code")
        if rlm_kwargs.get("context_payload") is not None:
            self.load_context(rlm_kwargs["context_payload"])

    def setup(self):
        """Lease the interpreter and define the RLM's REPL in it."""
        if self.sandbox is not None:
            return
        self.sandbox = Sandbox.create(self.pool, self.namespace, **self._sandbox_kwargs)
        self._install()

    def _install(self):
        """The REPL's scaffold, the custom tools and the setup code, in the interpreter."""
        setup = _scaffold()
        if self.compaction:
            setup += "\n_wp_compaction = []\nhistory = _wp_compaction\n"
        for code in (setup, self._tools_code(), self._setup_code):
            if code:
                ex = self.sandbox.run_code(code)
                if not ex.ok:
                    raise RuntimeError(f"setting up the environment failed: {ex.error}")

    def _tools_code(self):
        """Custom tools the sandbox can hold: values as JSON, functions as their
        source (a str starting with def). A host callable cannot cross into the
        sandbox: the bridge answers the model calls only."""
        lines = []
        for name, tool in self._tools.items():
            value = _tool_value(tool)
            if isinstance(value, str) and value.lstrip().startswith(("def ", "class ", "async def ")):
                lines.append(value)
            else:
                lines.append(f"{name} = __import__('json').loads({json.dumps(value)!r})")
        return "\n".join(lines)

    def load_context(self, context_payload):
        """Make ``context`` and ``context_0`` the payload: a str, dict or list, anything JSON."""
        self.add_context(context_payload, 0)

    def _answer_llm(self, prompt, model=None):
        if self._llm_query is not None:
            return self._llm_query(prompt)
        if self.lm_handler_address is None:
            return "Error: No LM handler configured"
        from rlm.core.comms_utils import LMRequest, send_lm_request  # the reference RLM's own, when it runs us
        response = send_lm_request(self.lm_handler_address, LMRequest(prompt=prompt, model=model, depth=self.depth))
        if not response.success:
            return f"Error: {response.error}"
        self._calls_made.append(response.chat_completion)
        return response.chat_completion.response

    def execute_code(self, code: str) -> REPLResult:
        """Run the model's code; its variables stay for the next call. The
        scaffold's names are put back after it, and an answer it gave is
        ``final_answer``."""
        self.setup()
        self._calls_made = calls = []
        if self._turn_pending:  # a new turn with no add_context to carry its start (the RLM always sends one)
            self.sandbox.run_code("_warmpool_turn()")
            self._turn_pending = False

        def llm(prompt):
            if self._llm_query is not None:
                calls.append({"method": "llm_query", "prompt": prompt})
            return self._answer_llm(prompt)

        def rlm(task, ctx):
            if self._rlm_query is not None:
                calls.append({"method": "rlm_query", "task": task})
                return self._rlm_query(task, ctx)
            if self._subcall_fn is not None:
                done = self._subcall_fn(task, None)
                calls.append(done)
                return getattr(done, "response", done)
            if self._llm_query is not None:
                calls.append({"method": "rlm_query", "task": task})
            return self._answer_llm(task)

        start = time.monotonic()
        try:
            ex = self.sandbox.run_code(code, timeout=self.timeout, on_llm_query=llm, on_rlm_query=rlm,
                                       max_bridge_calls=self.max_llm_calls)
        except errors.SessionLostError as lost:
            return self._lost(lost, calls, start)
        final, error, stderr = None, None, ex.stderr
        if ex.final:
            final = ex.text  # the sandbox's own FINAL, called past the scaffold's
        if ex.error is not None and ex.error.name != "_WarmpoolFinal":
            error = ex.error.traceback or f"{ex.error.name}: {ex.error.value}"
            stderr = (stderr + ("" if not stderr or stderr.endswith("\n") else "\n") + error)
        if any(n in code for n in _AFTER_NAMES) or (ex.error is not None and ex.error.name == "_WarmpoolFinal"):
            given = self._after()
            if given is not None:
                final = given
        return REPLResult(stdout=ex.stdout, stderr=stderr, locals=LazyLocals(self.sandbox),
                          execution_time=time.monotonic() - start, rlm_calls=calls, final_answer=final,
                          result=None if ex.error is not None and ex.error.name == "_WarmpoolFinal" else ex.text,
                          error=error)

    def _lost(self, lost, calls, start):
        """The code ended its interpreter (it exited, or ran it out of memory),
        and with it the Session: the model is told, in stderr, that every
        variable and context is gone, and the next call leases a fresh
        Session with the REPL's scaffold, so the conversation can go on."""
        ex = getattr(lost, "execution", None)
        why = f"{lost}"
        try:
            self.sandbox.close()
        except errors.WarmpoolError:
            pass  # already gone
        self.sandbox = None
        self._contexts.clear()
        self._histories.clear()
        stderr = (ex.stderr if ex is not None else "")
        stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + _RESTARTED
        return REPLResult(stdout=ex.stdout if ex is not None else "", stderr=stderr, locals={},
                          execution_time=time.monotonic() - start, rlm_calls=calls, error=why)

    def _after(self):
        """The scaffold back, and the answer the cell gave (None: none)."""
        ex = self.sandbox.run_code("_warmpool_after()")
        if not ex.ok:
            raise RuntimeError(f"restoring the REPL's names after a cell failed: {ex.error}")
        if ex.text in (None, "None"):
            return None
        try:
            return ast.literal_eval(ex.text)
        except (ValueError, SyntaxError):  # cut short: read it whole
            return self.sandbox.get_variable("_wp_last_final")

    # -- the persistence protocol (SupportsPersistence) --------------------

    def update_handler_address(self, address) -> None:
        """The RLM's model handler for this turn; the RLM calls this first in
        each turn of a persistent conversation, so a new completion starts
        here: no answer yet (a ready left from the last turn ends nothing)."""
        self.lm_handler_address = address
        self._turn_pending = True

    def add_context(self, context_payload, context_index: Optional[int] = None) -> int:
        """Set ``context_N`` (the next N unless given); ``context`` is the
        alias of ``context_0``. Returns N."""
        self.setup()
        index = self._next(self._contexts) if context_index is None else int(context_index)
        code = f"context_{index} = context\ncontext = globals().get('context_0', context)"
        if self._turn_pending:
            code, self._turn_pending = "_warmpool_turn()\n" + code, False
        ex = self.sandbox.run_code(code, context=context_payload)
        if not ex.ok:
            raise RuntimeError(f"loading context_{index} failed: {ex.error}")
        self._contexts.add(index)
        return index

    def get_context_count(self) -> int:
        return self._next(self._contexts)

    def add_history(self, message_history, history_index: Optional[int] = None) -> int:
        """Set ``history_N`` to a copy of the messages (the next N unless
        given); ``history`` is the alias of ``history_0`` (or, with
        compaction, the compaction list). Returns N."""
        self.setup()
        index = self._next(self._histories) if history_index is None else int(history_index)
        data = json.dumps(message_history)  # a copy: the caller may change its list afterwards
        ex = self.sandbox.run_code(
            f"import json as _json\nhistory_{index} = _json.loads({data!r})\n"
            f"if _wp_compaction is None and ({index} == 0 or 'history' not in globals()):\n    history = history_{index}")
        if not ex.ok:
            raise RuntimeError(f"loading history_{index} failed: {ex.error}")
        self._histories.add(index)
        return index

    def get_history_count(self) -> int:
        return self._next(self._histories)

    def append_compaction_entry(self, entry) -> None:
        """Append an entry (the messages of an iteration, or a summary) to
        ``history``, the compaction list. Ignored with ``compaction=False``."""
        if self.compaction is False:
            return
        self.setup()
        ex = self.sandbox.run_code(f"_warmpool_compact(__import__('json').loads({json.dumps(entry)!r}))")
        if not ex.ok:
            raise RuntimeError(f"appending to the compaction history failed: {ex.error}")

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


def register(module=None, **defaults):
    """Teach the reference RLM ``environment="warmpool"``, single-turn and
    persistent.

    The reference RLM has no plug-in point: its ``get_environment`` is a fixed
    list, imported by name into the module that builds environments
    (``rlm.core.rlm``), and ``RLM(persistent=True)`` checks the environment's
    name against a fixed set in ``RLM._validate_persistent_environment_support``.
    ``register`` wraps both (patching no set): ``"warmpool"`` builds a
    WarmpoolREPL and is accepted as persistent, every other name goes to the
    RLM's own. ``defaults`` are environment kwargs for every warmpool
    environment (``pool``, ``namespace``, ``kubeconfig``, ``idle_timeout``...),
    under the RLM's ``environment_kwargs``. Calling it again replaces the
    defaults. ``module`` is ``rlm.core.rlm`` (default: imported)."""
    import importlib
    if module is None:
        module = importlib.import_module("rlm.core.rlm")
    _defaults.clear()
    _defaults.update(defaults)
    targets = [module]
    try:
        targets.append(importlib.import_module("rlm.environments"))
    except ImportError:
        pass
    for target in targets:
        original = getattr(target, "get_environment", None)
        if original is None or getattr(original, "_warmpool", False):
            continue

        def get_environment(environment, environment_kwargs, _original=original):
            if environment == "warmpool":
                kwargs = {**_defaults, **(environment_kwargs or {})}
                return WarmpoolREPL(kwargs.pop("pool", "python"), kwargs.pop("namespace", None), **kwargs)
            return _original(environment, environment_kwargs)

        get_environment._warmpool = True
        target.get_environment = get_environment
    rlm_class = getattr(module, "RLM", None)
    validate = getattr(rlm_class, "_validate_persistent_environment_support", None)
    if validate is not None and not getattr(validate, "_warmpool", False):
        def _validate_persistent_environment_support(self, _original=validate):
            if getattr(self, "environment_type", None) == "warmpool":
                return None
            return _original(self)

        _validate_persistent_environment_support._warmpool = True
        rlm_class._validate_persistent_environment_support = _validate_persistent_environment_support


_defaults: dict = {}
