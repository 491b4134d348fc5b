# Run inside the sandbox, never imported on the host: warmpool.rlm sends this
# file's text as the first run of a WarmpoolREPL's Session. It gives the
# model's code the reference RLM's REPL on top of the sandbox's own helpers:
# llm_query(prompt, model=None) and the rest with its signatures, the `answer`
# dict whose answer["ready"] = True ends the completion with
# answer["content"] (at the moment it is set, once per setting: a ready left
# from an earlier turn does not end the next), and FINAL/FINAL_VAR as
# shorthands for it that stop the cell. They are the environment's, not the
# sandbox's once-per-Session FINAL: an RLM conversation ends one completion
# per turn.
# flake8: noqa


class _WarmpoolFinal(BaseException):
    """Ends the cell after FINAL or FINAL_VAR (a BaseException: `except Exception` in the code does not catch it)."""


class _AnswerDict(dict):
    """The completion signal: setting "ready" to a true value ends the completion with "content"."""

    def __init__(self, items=None):
        super().__init__({"content": "", "ready": False})
        if items:
            dict.update(self, items)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "ready" and value:
            globals()["_wp_final"] = str(self.get("content", ""))


def FINAL(value):
    """Ends this completion with `value` as its answer: answer["content"] = value, answer["ready"] = True."""
    answer["content"] = value
    answer["ready"] = True
    raise _WarmpoolFinal()


def FINAL_VAR(name):
    """Ends this completion with the value of the variable `name` as its answer."""
    if name not in globals():
        raise NameError(f"FINAL_VAR: no variable named {name!r}")
    FINAL(globals()[name])


def SHOW_VARS():
    """The names and types of the variables defined so far."""
    return {k: type(v).__name__ for k in _warmpool_names() for v in (globals()[k],)}


# The sandbox's own, which the reference signatures below call.
_wp_sandbox = (llm_query, llm_query_batched, rlm_query, rlm_query_batched)


def llm_query(prompt, model=None):
    """Asks the caller's language model; returns its answer. The caller's model answers, whatever `model` says."""
    return _wp_sandbox[0](prompt)


def llm_query_batched(prompts, model=None):
    """Asks the caller's language model each prompt, concurrently; returns the answers in order."""
    return _wp_sandbox[1](prompts)


def rlm_query(prompt, model=None):
    """Asks the caller to run a recursive sub-task on `prompt` alone (no context is sent with it)."""
    return _wp_sandbox[2](prompt, "")


def rlm_query_batched(prompts, model=None):
    """Runs recursive sub-tasks concurrently; returns the answers in order."""
    return _wp_sandbox[3]([(p, "") for p in prompts])


answer = _AnswerDict()
_wp_final = None
_wp_last_final = None
_wp_compaction = None
_wp_scaffold = {"llm_query": llm_query, "llm_query_batched": llm_query_batched, "rlm_query": rlm_query,
                "rlm_query_batched": rlm_query_batched, "SHOW_VARS": SHOW_VARS, "FINAL": FINAL, "FINAL_VAR": FINAL_VAR}


def _warmpool_turn():
    """A new completion (turn) begins: no answer yet."""
    global answer, _wp_final
    answer, _wp_final = _AnswerDict(), None


def _warmpool_after():
    """After a cell: the scaffold's names back where the code rebound them, and the answer it gave, if any."""
    global answer, context, history, _wp_final, _wp_last_final
    g = globals()
    for k, v in _wp_scaffold.items():
        if g.get(k) is not v:
            g[k] = v
    if not isinstance(answer, _AnswerDict):
        plain = answer if isinstance(answer, dict) else {}
        answer = _AnswerDict(plain)
        if plain.get("ready"):
            _wp_final = str(plain.get("content", ""))
    if "context_0" in g:
        context = g["context_0"]
    if _wp_compaction is not None:
        history = _wp_compaction
    elif "history_0" in g:
        history = g["history_0"]
    _wp_last_final, _wp_final = _wp_final, None
    return _wp_last_final


def _warmpool_compact(entry):
    """Appends an entry (a list of messages, or a summary) to the compaction history, which `history` is."""
    global _wp_compaction, history
    if _wp_compaction is None:
        _wp_compaction = []
    _wp_compaction.append(entry)
    history = _wp_compaction


def _warmpool_names():
    """The names of the user's variables."""
    return [k for k, v in list(globals().items())
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module" and k != "answer"]


def _warmpool_locals(limit=4096):
    """The user's variables as JSON values, or their repr (cut at `limit`) when they are not JSON."""
    import json as _json
    out = {}
    for k in _warmpool_names():
        v = globals()[k]
        try:
            text = _json.dumps(v)
            out[k] = v if len(text) <= limit else text[:limit] + "..."
        except (TypeError, ValueError):
            r = repr(v)
            out[k] = r if len(r) <= limit else r[:limit] + "..."
    return out
