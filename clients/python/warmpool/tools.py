"""A plain tool function for tool-calling agents.

``python_tool(sandbox)`` returns ``run_python(code: str) -> str``: it runs the
code in the Sandbox (state kept between calls) and returns JSON with
``result``, ``stdout``, ``stderr`` and, when the code raised, ``error``. A
typed, documented function is what LangChain's ``tool``/``StructuredTool``,
LlamaIndex's ``FunctionTool`` and most agent frameworks wrap as they are;
``run_python.schema`` is the OpenAI-style function definition for frameworks
that want one.
"""

import json
from typing import Optional

from .sandbox import Sandbox

_DESCRIPTION = ("Run Python code in a persistent sandboxed interpreter (variables and files stay between calls). "
                "Returns JSON with the value of the last expression as `result`, `stdout`, `stderr` and, "
                "if the code raised, `error` with its name, message and traceback.")


def _seconds(t):
    # To the millisecond, the resolution run_code sends: 2 -> "2s", 0.25 -> "0.25s".
    return f"{t:.3f}".rstrip("0").rstrip(".") + "s"


def python_tool(sandbox: Sandbox, *, timeout: Optional[float] = None, name: str = "run_python"):
    """A tool function that runs code in ``sandbox``; ``timeout`` (seconds)
    interrupts a call that runs longer, keeping its partial output."""

    def run_python(code: str) -> str:
        ex = sandbox.run_code(code, timeout=timeout)
        out = ex.to_json()
        if ex.status == "timed_out" and "error" in out:
            # No timeout, or 0 (which run_code sends as "the default"): the sandbox's own ran out.
            limit = _seconds(timeout) if timeout else "the sandbox's timeout"
            out["error"]["value"] = f"the code ran longer than {limit} and was interrupted"
        return json.dumps(out)

    run_python.__name__ = run_python.__qualname__ = name
    run_python.__doc__ = _DESCRIPTION + "\n\nArgs:\n    code: Python source to run."
    run_python.schema = {
        "type": "function",
        "function": {
            "name": name, "description": _DESCRIPTION,
            "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python source to run."}},
                           "required": ["code"]},
        },
    }
    return run_python
