"""The reference RLM's REPL protocol on a warmpool Session (WarmpoolREPL):
what its loop relies on, each behaviour asserted on a real sandbox. The
reference package is not installable here; where the RLM's own code is
needed (its persistent-environment check, its model handler), a stand-in of
its module layout is put in sys.modules."""

import sys
import types
from dataclasses import dataclass

import pytest

import warmpool
import warmpool.rlm


@pytest.fixture
def env(cluster):
    e = warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=lambda p: f"<{p}>",
                              kubeconfig=cluster["kubeconfig"], persistent=True, idle_timeout=120)
    with e:
        yield e


def _stand_in_rlm(monkeypatch, built):
    """rlm.core.rlm and rlm.environments as the reference lays them out: a
    fixed get_environment, and an RLM whose persistent check is a set local
    to a method."""

    def get_environment(environment, environment_kwargs):
        built.append(environment)
        return f"{environment} env"

    class RLM:
        def __init__(self, environment="local", persistent=False, environment_kwargs=None):
            self.environment_type, self.persistent = environment, persistent
            self.environment_kwargs = environment_kwargs or {}
            if persistent:
                self._validate_persistent_environment_support()

        def _validate_persistent_environment_support(self):
            if self.environment_type not in {"local", "ipython", "docker"}:
                raise ValueError(f"persistent=True is not supported for environment type '{self.environment_type}'")

    mods = {n: types.ModuleType(n) for n in ("rlm", "rlm.core", "rlm.core.rlm", "rlm.environments")}
    mods["rlm.core.rlm"].get_environment = mods["rlm.environments"].get_environment = get_environment
    mods["rlm.core.rlm"].RLM = RLM
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    return mods["rlm.core.rlm"]


def test_a_persistent_rlm_on_warmpool_is_accepted_and_others_are_still_checked(monkeypatch):
    built = []
    mod = _stand_in_rlm(monkeypatch, built)
    with pytest.raises(ValueError, match="not supported for environment type 'warmpool'"):
        mod.RLM(environment="warmpool", persistent=True)
    warmpool.rlm.register(pool="python")
    warmpool.rlm.register(pool="python")  # twice is once
    assert mod.RLM(environment="warmpool", persistent=True).persistent
    assert mod.RLM(environment="local", persistent=True).persistent
    with pytest.raises(ValueError, match="not supported for environment type 'modal'"):
        mod.RLM(environment="modal", persistent=True)
    assert mod.get_environment("local", {}) == "local env" and built == ["local"]


def test_custom_tools_the_sandbox_cannot_hold_are_refused_before_any_session():
    for tools, error, match in (({"a b": 1}, ValueError, "not a Python name"),
                                ({"context": 1}, ValueError, "replace the REPL's own"),
                                ({"f": len}, TypeError, "a function of this process"),
                                ({"g": {"tool": print, "description": "d"}}, TypeError, "a function of this process")):
        with pytest.raises(error, match=match):
            warmpool.WarmpoolREPL("no-such-pool", "no-such-namespace", custom_tools=tools)


def test_custom_tools_are_defined_in_the_sandbox(cluster):
    tools = {"limit": 3, "double": "def double(x):\n    return 2 * x", "cfg": {"tool": {"a": 1}, "description": "settings"}}
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=str.upper, kubeconfig=cluster["kubeconfig"],
                               idle_timeout=120, custom_tools=tools) as env:
        assert env.execute_code("double(limit), cfg['a']").result == "(6, 1)"


def test_register_gives_its_defaults_under_the_rlms_kwargs(cluster, monkeypatch):
    mod = _stand_in_rlm(monkeypatch, [])
    warmpool.rlm.register(pool="no-such-pool", namespace=cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                          idle_timeout=120)
    env = mod.get_environment("warmpool", {"pool": cluster["pool"], "context_payload": "doc",
                                           "lm_handler_address": ("127.0.0.1", 1), "depth": 1, "persistent": True})
    try:
        assert env.pool == cluster["pool"] and env.namespace == cluster["namespace"]
        assert env.locals["context_0"] == "doc" and env.lm_handler_address == ("127.0.0.1", 1)
    finally:
        env.cleanup()


def test_the_answer_dict_ends_a_completion_when_ready_is_set_once_per_setting(env):
    r = env.execute_code("answer['content'] = 'forty-two'\nanswer['ready'] = True\nprint('after')")
    assert r.final_answer == "forty-two" and r.stdout == "after\n" and r.stderr == ""
    r = env.execute_code("x = answer['ready']")
    assert r.final_answer is None, "a ready left set must not end the next cell's completion again"
    # A new turn starts with no answer.
    env.update_handler_address(("127.0.0.1", 2))
    env.add_context("turn two")
    assert env.execute_code("answer['ready']").result == "False"
    # Code that rebinds answer to a plain dict still answers, and the dict is the signal again after it.
    r = env.execute_code("answer = {'content': 'plain', 'ready': True}")
    assert r.final_answer == "plain"
    assert env.execute_code("type(answer).__name__").result == "'_AnswerDict'"
    # An answer given before the cell failed still ends the completion; the error is shown too.
    r = env.execute_code("answer['content'] = 'partial'\nanswer['ready'] = True\n1 / 0")
    assert r.final_answer == "partial" and "ZeroDivisionError" in r.stderr


def test_final_ends_each_turn_of_a_conversation(env):
    r = env.execute_code("FINAL('one')\nprint('not reached')")
    assert r.final_answer == "one" and r.stdout == "" and r.error is None and r.stderr == ""
    env.update_handler_address(("127.0.0.1", 2))
    env.add_context("second question")
    r = env.execute_code("n = 2\ntry:\n    FINAL_VAR('n')\nexcept Exception:\n    print('caught')")
    assert r.final_answer == "2" and r.stdout == "", "FINAL stops the cell; `except Exception` does not catch it"
    # The sandbox's own FINAL (once per Session) is not what the RLM's code calls.
    r = env.execute_code("FINAL('three')")
    assert r.final_answer == "three"


def test_an_error_is_in_stderr_where_the_rlm_shows_the_model(env):
    r = env.execute_code("print('before')\n{}['missing']")
    assert r.stdout == "before\n"
    assert "KeyError: 'missing'" in r.stderr and "Traceback" in r.stderr
    assert "KeyError" in r.error and r.final_answer is None
    assert str(r).count("KeyError: 'missing'") == 1
    r = env.execute_code("print('fine')")
    assert r.stderr == "" and r.error is None


def test_context_is_context_0_and_scaffold_names_come_back_after_a_cell(env):
    env.load_context({"doc": "first"})
    assert env.add_context("second") == 1 and env.add_context("third") == 2
    assert env.get_context_count() == 3
    assert env.execute_code("context == context_0").result == "True"
    r = env.execute_code("context = 'hijacked'\nllm_query = lambda p: 'hijacked'\nanswer = None\nprint(context)")
    assert r.stdout == "hijacked\n"
    assert env.locals["context"] == {"doc": "first"}
    assert env.execute_code("llm_query('q')").result == "'<q>'"
    assert env.execute_code("type(answer).__name__").result == "'_AnswerDict'"
    env.add_history([{"role": "user", "content": "h0"}])
    env.add_history([{"role": "user", "content": "h1"}])
    env.execute_code("history = []")
    assert env.locals["history"] == [{"role": "user", "content": "h0"}] == env.locals["history_0"]
    assert env.get_history_count() == 2


def test_a_cell_that_ends_its_interpreter_leaves_a_repl_that_goes_on(env):
    env.load_context("doc")
    lost = env.sandbox
    r = env.execute_code("import os\nprint('before', flush=True)\nos._exit(3)")
    assert r.final_answer is None and r.stdout == "before\n" and "every variable and context" in r.stderr, r.stderr
    assert "exit code 3" in r.error and env.get_context_count() == 0
    r = env.execute_code("print(type(answer).__name__, 'context_0' in globals())\nFINAL('again')")
    assert r.final_answer == "again" and r.stdout == "_AnswerDict False\n", (r.stdout, r.stderr)
    assert env.sandbox.name != lost.name, "a fresh Session took the lost one's place"


def test_locals_is_live_and_whole(env):
    big = "x" * 10000
    env.load_context(big)
    assert env.locals["context_0"] == big, "a value longer than a result's repr comes back whole"
    assert "y" not in env.locals and env.locals.get("y") is None
    env.execute_code("y = {'a': [1, 2]}\nclass C: pass\nc = C()")
    assert env.locals["y"] == {"a": [1, 2]}
    assert "C object" in env.locals["c"], "a value that is not JSON shows as its repr"
    assert {"context", "context_0", "y", "c"} <= set(env.locals)
    assert "answer" not in env.locals and "llm_query" not in env.locals
    with pytest.raises(KeyError):
        env.locals["nope"]


def test_compaction_appends_to_history_and_survives_a_rebinding(cluster):
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=str.upper,
                               kubeconfig=cluster["kubeconfig"], idle_timeout=120) as env:
        assert "history" not in env.locals
        env.append_compaction_entry([{"role": "assistant", "content": "step 1"}])  # the RLM's first: compaction is on
        env.append_compaction_entry({"type": "summary", "content": "so far"})
        env.add_history([{"role": "user", "content": "an earlier turn"}])
        env.execute_code("history = None")
        assert env.locals["history"] == [[{"role": "assistant", "content": "step 1"}], {"type": "summary", "content": "so far"}]
        assert env.locals["history_0"] == [{"role": "user", "content": "an earlier turn"}]
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=str.upper,
                               kubeconfig=cluster["kubeconfig"], idle_timeout=120, compaction=True) as env:
        assert env.locals["history"] == [], "compaction on from the start: history is the (empty) list"
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=str.upper,
                               kubeconfig=cluster["kubeconfig"], idle_timeout=120, compaction=False) as env:
        env.append_compaction_entry({"type": "summary", "content": "ignored"})
        assert "history" not in env.locals


@dataclass
class _Completion:
    response: str


def _stand_in_handler(monkeypatch, asked):
    """rlm.core.comms_utils as the reference has it: the host side of its model handler."""

    @dataclass
    class LMRequest:
        prompt: object = None
        model: object = None
        depth: int = 0

    @dataclass
    class LMResponse:
        success: bool
        chat_completion: object = None
        error: str = ""

    def send_lm_request(address, request):
        asked.append((address, request.prompt, request.depth))
        if request.prompt == "fail":
            return LMResponse(False, error="the model is down")
        return LMResponse(True, _Completion(f"answer to {request.prompt}"))

    mods = {n: types.ModuleType(n) for n in ("rlm", "rlm.core", "rlm.core.comms_utils")}
    mods["rlm.core.comms_utils"].LMRequest, mods["rlm.core.comms_utils"].send_lm_request = LMRequest, send_lm_request
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)


def test_without_an_llm_query_the_rlms_own_model_answers_at_the_turns_address(cluster, monkeypatch):
    asked = []
    _stand_in_handler(monkeypatch, asked)
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"], idle_timeout=120,
                               lm_handler_address=("127.0.0.1", 5000), depth=1) as env:
        r = env.execute_code("print(llm_query('hi', model='m'))\nprint(llm_query('fail'))")
        assert r.stdout == "answer to hi\nError: the model is down\n"
        assert [c.response for c in r.rlm_calls] == ["answer to hi"]
        env.update_handler_address(("127.0.0.1", 6000))
        assert env.execute_code("rlm_query('sub')").result == "'answer to sub'"
        assert [a[0][1] for a in asked] == [5000, 5000, 6000]
        assert r.to_dict()["rlm_calls"] == [{"response": "answer to hi"}]
    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"], idle_timeout=120) as env:
        assert env.execute_code("llm_query('hi')").result == "'Error: No LM handler configured'"


def test_a_three_turn_conversation_through_the_rlm_protocol(cluster, monkeypatch):
    """The reference loop's calls in its order, with a scripted model: each
    turn a fresh handler address and context, code blocks until one answers,
    then the turn's messages as a history."""
    mod = _stand_in_rlm(monkeypatch, [])
    warmpool.rlm.register(namespace=cluster["namespace"], kubeconfig=cluster["kubeconfig"], idle_timeout=120,
                          llm_query=lambda p: f"<{p}>")
    script = [
        ["doc1_summary = 'Summarized: ' + context_0.upper()", "answer['content'] = doc1_summary\nanswer['ready'] = True"],
        ["doc2_summary = 'Summarized: ' + context_1.upper()\ncmp = 'Compared ' + doc1_summary + ' with ' + doc2_summary",
         "FINAL_VAR('cmp')"],
        ["print(len(history), history_1[-1]['content'])",
         "n = len([k for k in globals() if k.startswith('context_')])\nFINAL(llm_query(f'synthesized from {n}'))"],
    ]
    env, answers = None, []
    for turn, (prompt, blocks) in enumerate(zip(["first document", "second document", "what now?"], script)):
        address = ("127.0.0.1", 7000 + turn)
        if env is None:
            env = mod.get_environment("warmpool", {"pool": cluster["pool"], "context_payload": prompt,
                                                   "lm_handler_address": address, "depth": 1, "persistent": True})
        else:
            env.update_handler_address(address)
            env.add_context(prompt)
        messages = [{"role": "user", "content": prompt}]
        final = None
        for block in blocks:
            r = env.execute_code(block)
            assert r.stderr == "", r.stderr
            messages.append({"role": "assistant", "content": block})
            if r.final_answer is not None:
                final = r.final_answer
                break
            assert not r.stdout or turn == 2
        assert final is not None, f"turn {turn + 1} never ended"
        env.add_history(messages)
        answers.append(final)
    try:
        assert answers[0] == "Summarized: FIRST DOCUMENT"
        assert answers[1] == "Compared Summarized: FIRST DOCUMENT with Summarized: SECOND DOCUMENT"
        assert answers[2] == "<synthesized from 3>"
        assert env.get_context_count() == 3 and env.get_history_count() == 3
        assert env.locals["doc1_summary"] == "Summarized: FIRST DOCUMENT"
        assert env.locals["context"] == "first document"
        assert env.locals["history"] == env.locals["history_0"]
    finally:
        env.cleanup()
