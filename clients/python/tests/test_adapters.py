"""The adapters' contracts, without any agent framework installed."""

import inspect
import json

import warmpool


def test_rlm_environment_answers_llm_query_on_the_host(cluster):
    prompts = []

    def model(prompt):
        prompts.append(prompt)
        return f"summary of {len(prompt)} chars"

    env = warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=model, kubeconfig=cluster["kubeconfig"])
    with env:
        env.load_context({"doc": "abc" * 1000, "question": "how long?"})
        r = env.execute_code("parts = chunk_text(context['doc'], size=1000, overlap=0)\nprint(len(parts))")
        assert r.stdout == "3\n" and r.error is None and r.final_answer is None
        r = env.execute_code("answers = [llm_query(p) for p in parts]\nanswers[0]")
        assert r.result == "'summary of 1000 chars'"
        assert [c["method"] for c in r.llm_calls] == ["llm_query"] * 3
        doc = "abc" * 1000
        assert prompts == [doc[:1000], doc[1000:2000], doc[2000:]]
        # rlm_query without a handler of its own falls back to llm_query on the task.
        r = env.execute_code("sub = rlm_query('count words')")
        assert r.error is None and r.llm_calls == [{"method": "rlm_query", "task": "count words"}]
        r = env.execute_code("SHOW_VARS()")
        assert "'answers': 'list'" in r.result and "'context': 'dict'" in r.result
        r = env.execute_code("1 / 0")
        assert "ZeroDivisionError" in r.error and "ZeroDivisionError" in str(r)
        r = env.execute_code("verdict = f\"{len(answers)} parts: {context['question']}\"\nFINAL_VAR('verdict')\nprint('not reached')")
        assert r.final_answer == "3 parts: how long?" and r.stdout == ""
        sandbox = env.sandbox
    assert env.sandbox is None
    try:
        gone = sandbox.get()["metadata"].get("deletionTimestamp") is not None
    except warmpool.NotFoundError:
        gone = True
    assert gone, "leaving the with block closes the Session"


def test_rlm_environment_reports_a_failing_model_to_the_code(cluster):
    def broken(prompt):
        raise ConnectionError("model endpoint down")

    with warmpool.WarmpoolREPL(cluster["pool"], cluster["namespace"], llm_query=broken,
                               kubeconfig=cluster["kubeconfig"]) as env:
        r = env.execute_code("try:\n    llm_query('x')\nexcept RuntimeError as e:\n    print('caught', e)")
        assert "caught" in r.stdout and "model endpoint down" in r.stdout


def test_tool_function_returns_json_a_model_can_read(sandbox):
    run_python = warmpool.python_tool(sandbox, timeout=2)
    assert run_python.__name__ == "run_python"
    assert list(inspect.signature(run_python).parameters) == ["code"]
    assert inspect.signature(run_python).parameters["code"].annotation is str
    assert run_python.schema["function"]["parameters"]["required"] == ["code"]
    assert "persistent" in run_python.__doc__

    out = json.loads(run_python("n = 21\nprint('hi')\nn * 2"))
    assert out == {"result": "42", "stdout": "hi\n", "stderr": ""}
    out = json.loads(run_python("n + undefined"))
    assert out["error"]["name"] == "NameError" and "undefined" in out["error"]["value"]
    out = json.loads(run_python("import time\nprint('a', flush=True)\ntime.sleep(30)"))
    assert out["stdout"] == "a\n" and "interrupted" in out["error"]["value"]
    assert json.loads(run_python("n"))["result"] == "21", "state survives a timed-out call"
