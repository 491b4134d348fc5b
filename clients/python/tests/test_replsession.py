"""The RLM REPL session (REPLSession) and the reference RLM's environment
contract (WarmpoolREPL) on a warmpool Session."""

import sys
import types
import typing

import pytest

import warmpool
import warmpool.rlm

CHUNKS = {
    "c1": {"text": "The launch deadline is March 3.", "tags": ["plan"], "links": ["c2", {"id": "c3", "type": "cites"}]},
    "c2": {"text": "Budget: 40k.", "tags": ["plan", "money"]},
    "c3": {"text": "Source: the board minutes.", "tags": []},
}


class Model:
    def __init__(self):
        self.prompts = []

    def complete(self, prompt):
        self.prompts.append(prompt)
        return f"model saw {len(prompt)} chars"


@pytest.fixture
def repl(cluster):
    with warmpool.REPLSession(CHUNKS, Model(), max_iterations=3, timeout_seconds=2, pool=cluster["pool"],
                              namespace=cluster["namespace"], kubeconfig=cluster["kubeconfig"]) as r:
        yield r


def test_needs_a_chunk_store_and_a_model():
    with pytest.raises(ValueError, match="chunk_store"):
        warmpool.REPLSession(None, Model())
    with pytest.raises(ValueError, match="llm_client"):
        warmpool.REPLSession({}, None)


def test_fresh_session(repl):
    assert repl.iteration_count == 0 and repl.get_result() is None and repl.get_state() == {}


def test_memory_functions_reach_the_callers_store(repl):
    out = repl.execute("""
hits = search_chunks('deadline')
c = read_chunk(hits[0])
print(hits, c['text'], read_chunk('nope'))
print(sorted(x['id'] for x in list_chunks_by_tag('plan')))
print([x['id'] for x in get_linked_chunks('c1')], [x['id'] for x in get_linked_chunks('c1', 'cites')])
print(search_chunks('e', limit=2))
""")
    assert out["success"], out
    assert out["output"] == ("['c1'] The launch deadline is March 3. None\n['c1', 'c2']\n['c2', 'c3'] ['c3']\n"
                             "['c1', 'c2']\n")
    # The chunks were never in the sandbox's context.
    assert repl.execute("context")["result"] is None


def test_a_store_with_its_own_methods(cluster):
    class Store:
        def __init__(self):
            self.asked = []

        def read_chunk(self, chunk_id):
            self.asked.append(chunk_id)
            return {"id": chunk_id, "text": "own"}

        def search_chunks(self, query, limit=10):
            return ["x"][:limit]

        def list_chunks_by_tag(self, tag):
            return []

        def get_linked_chunks(self, chunk_id, link_type=None):
            return []

    store = Store()
    with warmpool.REPLSession(store, lambda p: "ok", pool=cluster["pool"], namespace=cluster["namespace"],
                              kubeconfig=cluster["kubeconfig"]) as r:
        assert r.execute("read_chunk(search_chunks('q')[0])['text']")["result"] == "'own'"
    assert store.asked == ["x"]


def test_llm_query_counts_iterations_and_stops_at_the_limit(repl):
    out = repl.execute("a = llm_query('hi')\nb = llm_query('sum', context={'n': 2})\nprint(a)")
    assert out["success"] and out["output"] == "model saw 2 chars\n" and out["iteration_count"] == 2
    assert repl.llm_client.prompts[1] == 'sum\n\nContext:\n{"n": 2}'
    out = repl.execute("state['answers'] = [llm_query('x')]\nllm_query('one too many')")
    assert not out["success"] and out["error_type"] == "MaxIterationsExceeded", out
    assert "max_iterations (3) exceeded" in out["error"]
    assert repl.iteration_count == 3
    assert repl.get_state() == {"answers": ["model saw 1 chars"]}  # state survives the calls


def test_state_persists_and_final_once(repl):
    repl.execute("state['step'] = 1")
    repl.execute("state['step'] += 1\nstate['seen'] = ['a']")
    assert repl.get_state() == {"step": 2, "seen": ["a"]}
    out = repl.execute("FINAL(f\"done after {state['step']} steps\")\nprint('not reached')")
    assert out["final"] and out["result"] == "done after 2 steps" and out["output"] == ""
    assert repl.get_result() == "done after 2 steps"
    again = repl.execute("FINAL('twice')")
    assert not again["success"] and "only once" in again["error"]
    assert repl.get_result() == "done after 2 steps"


def test_errors_are_reported(repl):
    out = repl.execute("def f(:\n  pass")
    assert out["error_type"] == "SyntaxError" and not out["success"]
    out = repl.execute("print('partial')\n{}['missing']")
    assert out["error_type"] == "KeyError" and "missing" in out["error"] and out["output"] == "partial\n"
    out = repl.execute("n = 0\nwhile n >= 0: n += 1")
    assert out["error_type"] == "TimeoutError" and "timeout_seconds (2 s)" in out["error"]
    assert repl.execute("1 + 1")["result"] == "2"  # the session goes on


def test_warmpool_repl_full_contract(cluster):
    env = warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=lambda p: f"<{p}>",
                                kubeconfig=cluster["kubeconfig"], persistent=True, depth=1)
    assert isinstance(env, _SupportsPersistence)
    with env:
        env.load_context("first")
        assert env.add_context({"k": "second"}) == 1
        assert env.get_context_count() == 2
        assert env.add_history([{"role": "user", "content": "hi"}]) == 0
        msgs = [{"role": "assistant", "content": "later"}]
        assert env.add_history(msgs) == 1
        msgs.append({"role": "user", "content": "changed after"})
        assert env.get_history_count() == 2
        r = env.execute_code("x = 41 + 1\nprint(context_0, context_1['k'], context, history[0]['content'], len(history_1))")
        assert r.stdout == "first second first hi 1\n"  # context is context_0, as in the reference REPL
        assert r.locals["x"] == 42 and r.locals["context_0"] == "first"
        assert isinstance(r.execution_time, float) and r.final_answer is None
        r = env.execute_code("print(llm_query_batched(['a', 'b']), rlm_query_batched(['t']))")
        assert r.stdout == "['<a>', '<b>'] ['<t>']\n"
        assert [c["method"] for c in r.rlm_calls] == ["llm_query", "llm_query", "rlm_query"]
        r = env.execute_code("FINAL_VAR('x')")
        assert r.final_answer == "42"


@typing.runtime_checkable
class _SupportsPersistence(typing.Protocol):
    """The reference RLM's persistence protocol, by its methods."""

    def update_handler_address(self, address): ...

    def add_context(self, context_payload, context_index=None): ...

    def get_context_count(self): ...

    def add_history(self, message_history, history_index=None): ...

    def get_history_count(self): ...


def test_register_adds_warmpool_to_the_reference_rlm(cluster, monkeypatch):
    # A stand-in for the reference package's layout (rlm.core.rlm imports
    # get_environment by name from rlm.environments); the package itself
    # is not installable here.
    built = []

    def get_environment(environment, environment_kwargs):
        built.append(environment)
        return "local env"

    pkg, core, mod, envs = (types.ModuleType(n) for n in ("rlm", "rlm.core", "rlm.core.rlm", "rlm.environments"))
    mod.get_environment = envs.get_environment = get_environment
    for name, m in {"rlm": pkg, "rlm.core": core, "rlm.core.rlm": mod, "rlm.environments": envs}.items():
        monkeypatch.setitem(sys.modules, name, m)
    warmpool.rlm.register()
    assert mod.get_environment("local", {}) == "local env" and built == ["local"]
    env = mod.get_environment("warmpool", {"pool": cluster["pool"], "namespace": cluster["namespace"],
                                           "kubeconfig": cluster["kubeconfig"], "llm_query": str.upper,
                                           "lm_handler_address": ("127.0.0.1", 1), "persistent": True})
    try:
        assert isinstance(env, warmpool.WarmpoolREPL)
        assert env.execute_code("llm_query('x')").result == "'X'"
    finally:
        env.cleanup()
    warmpool.rlm.register()  # twice is once
    assert mod.get_environment("local", {}) == "local env"
