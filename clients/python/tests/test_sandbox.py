import datetime
import threading
import time

import pytest

import warmpool


def test_state_survives_between_runs(sandbox):
    assert sandbox.run_code("x = 6 * 7").ok
    ex = sandbox.run_code("x")
    assert ex.text == "42" and ex.result == "42"
    assert ex.duration > 0


def test_runs_reuse_one_connection(sandbox, monkeypatch):
    # A streamed run whose connection is not read to its end is dropped, and
    # every run after it would pay a new TLS handshake.
    import urllib3.connection
    connects = []
    connect = urllib3.connection.HTTPSConnection.connect
    monkeypatch.setattr(urllib3.connection.HTTPSConnection, "connect",
                        lambda self, *a, **kw: (connects.append(1), connect(self, *a, **kw))[1])
    sandbox.run_code("1")  # a connection of the pool may have gone idle meanwhile
    connects.clear()
    for _ in range(5):
        assert sandbox.run_code("print(1)").stdout == "1\n"
    assert connects == []


def test_output_streams_in_order_and_errors_are_typed(sandbox):
    seen = []
    ex = sandbox.run_code("import sys\nfor i in range(5):\n    print(i, flush=True)\nprint('warn', file=sys.stderr)",
                          on_stdout=seen.append)
    assert "".join(seen) == "0\n1\n2\n3\n4\n"
    assert ex.stdout == "0\n1\n2\n3\n4\n" and ex.stderr == "warn\n"
    bad = sandbox.run_code("1 / 0")
    assert bad.status == "failed"
    assert bad.error.name == "ZeroDivisionError" and "division by zero" in bad.error.value
    assert "Traceback" in bad.error.traceback
    assert bad.to_json()["error"]["name"] == "ZeroDivisionError"


def test_llm_query_is_answered_by_the_caller(sandbox):
    ex = sandbox.run_code("a = llm_query('2+2?')\nb = rlm_query('sum', [1, 2])\na + ' ' + b",
                          on_llm_query=lambda prompt: "four" if prompt == "2+2?" else "?",
                          on_rlm_query=lambda task, ctx: f"{task}={sum(ctx)}")
    assert ex.text == "'four sum=3'"

    def refuse(prompt):
        raise RuntimeError("model unavailable")

    failed = sandbox.run_code("llm_query('x')", on_llm_query=refuse)
    assert failed.status == "failed" and "model unavailable" in failed.error.value


def test_a_late_bridge_answer_keeps_the_result(sandbox):
    # The run times out while the caller still thinks about its llm_query:
    # the answer comes too late for anyone, and the result is still returned.
    def slow(prompt):
        time.sleep(2)  # past the run's timeout
        return "too late"

    ex = sandbox.run_code("print('asking', flush=True)\nllm_query('x')", on_llm_query=slow, timeout=1)
    assert ex.status == "timed_out"
    assert ex.stdout == "asking\n"
    assert sandbox.run_code("1 + 1").text == "2"


def test_timeout_interrupts_with_partial_output(sandbox):
    ex = sandbox.run_code("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)", timeout=1)
    assert ex.status == "timed_out"
    assert ex.error.name == "KeyboardInterrupt"
    assert ex.stdout == "started\n"
    assert sandbox.run_code("1 + 1").text == "2", "the interpreter survives a timeout"


def test_interrupt_from_another_thread(sandbox):
    started = threading.Event()
    result = {}

    def run():
        result["ex"] = sandbox.run_code("import time\nprint('go', flush=True)\ntime.sleep(60)",
                                        on_stdout=lambda _: started.set())

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(20)
    assert sandbox.interrupt()
    t.join(20)
    assert result["ex"].status == "interrupted" and result["ex"].error.name == "KeyboardInterrupt"
    assert not sandbox.interrupt(), "nothing runs any more"


def test_variables_files_and_reset(sandbox):
    sandbox.run_code("data = {'a': [1, 2], 'b': None}\nobj = object()")
    assert sandbox.get_variable("data") == {"a": [1, 2], "b": None}
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        sandbox.get_variable("obj")
    with pytest.raises(warmpool.NotFoundError):
        sandbox.get_variable("missing")

    sandbox.files.write("in/data.txt", "hello")
    assert sandbox.run_code("open('in/data.txt').read().upper()").text == "'HELLO'"
    sandbox.run_code("open('out.bin', 'wb').write(bytes([0, 1, 2]))")
    assert sandbox.files.read("out.bin", format="bytes") == b"\x00\x01\x02"
    sandbox.run_code("import os\nos.mkdir('in/sub')")
    entries = {e.name: e for e in sandbox.files.list("in")}
    data, sub = entries["data.txt"], entries["sub"]
    assert (data.type, data.path, data.size, data.dir) == ("file", "/in/data.txt", 5, False)
    assert (sub.type, sub.path, sub.dir) == ("dir", "/in/sub", True)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - data.modified_time) < datetime.timedelta(minutes=5)
    assert data["name"] == "data.txt" and data["mode"] == data.mode, "entries are still the agent's dicts"

    sandbox.reset()
    assert sandbox.run_code("'data' in globals()").text == "False"
    assert sandbox.files.read("in/data.txt") == "hello", "files survive a reset"


def test_connect_attaches_to_the_same_interpreter(cluster, sandbox):
    sandbox.run_code("kept = 'yes'")
    other = warmpool.Sandbox.connect(sandbox.name, cluster["namespace"], kubeconfig=cluster["kubeconfig"])
    assert other.run_code("kept").text == "'yes'"


def test_context_and_envs_at_creation(cluster):
    with warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                                 context={"n": 3}, envs={"GREETING": "hi"}) as sb:
        assert sb.run_code("import os\n(context['n'], os.environ['GREETING'])").text == "(3, 'hi')"


def test_a_durable_sandbox_asks_for_checkpoints_and_numbers_its_runs(cluster):
    with warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                                 checkpoint=0) as sb:
        assert sb.get()["spec"]["checkpoint"] == {"interval": "0s"}
        first, second = sb.run_code("a = 1"), sb.run_code("a + 1")
        assert (first.run, second.run, second.text) == (1, 2, "2")
        assert first.moved is None


def test_context_per_run_replaces_the_global(sandbox):
    assert sandbox.run_code("len(context)", context=[1, 2, 3]).text == "3"
    assert sandbox.run_code("context[0]").text == "1", "the context stays for later runs"
    assert sandbox.run_code("context['k']", context={"k": "v"}).text == "'v'"


def test_a_user_without_the_role_is_told_what_is_missing(cluster, sandbox):
    viewer = warmpool.Sandbox.connect(sandbox.name, cluster["namespace"], kubeconfig=cluster["viewer_kubeconfig"])
    with pytest.raises(warmpool.ForbiddenError) as e:
        viewer.run_code("1")
    assert e.value.status == 403
    assert "sessions/exec" in str(e.value) and "data.warmpool.dev" in str(e.value)
    with pytest.raises(warmpool.ForbiddenError, match="create.*sessions"):
        warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["viewer_kubeconfig"])


def test_the_creator_is_recorded_and_an_owner_only_sandbox_serves_it_alone(cluster, sandbox):
    assert sandbox.get()["spec"]["owner"] == "sdk-user"
    assert sandbox.get()["spec"]["access"] == "Namespace"
    # Another editor of the namespace may use a Session open to the namespace...
    shared = warmpool.Sandbox.connect(sandbox.name, cluster["namespace"], kubeconfig=cluster["other_kubeconfig"])
    assert shared.run_code("1 + 1").text == "2"

    with warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                                 owner_only=True) as sb:
        assert sb.get()["spec"]["owner"] == "sdk-user" and sb.get()["spec"]["access"] == "Owner"
        sb.run_code("secret = 'mine'")
        # ...but not one bound to its owner, whatever RBAC allows.
        other = warmpool.Sandbox.connect(sb.name, cluster["namespace"], kubeconfig=cluster["other_kubeconfig"])
        for attempt in (lambda: other.run_code("secret"), lambda: other.files.read("x"), lambda: other.get_variable("secret")):
            with pytest.raises(warmpool.ForbiddenError, match="serves its owner alone") as e:
                attempt()
            assert e.value.status == 403
        assert sb.run_code("secret").text == "'mine'"


def test_closed_sandbox_says_its_state_is_gone(cluster):
    sb = warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"], timeout=1)
    deadline = time.time() + 30
    while sb.get().get("status", {}).get("phase") != "Closed" and time.time() < deadline:
        time.sleep(0.5)
    with pytest.raises(warmpool.APIError) as e:
        sb.run_code("1")
    assert e.value.status == 409 and "Closed" in str(e.value)
    sb.close()


def test_missing_pool_is_a_clear_error(cluster):
    with pytest.raises(warmpool.PoolNotFoundError, match="not found"):
        warmpool.Sandbox.create("no-such-pool", cluster["namespace"], kubeconfig=cluster["kubeconfig"], request_timeout=20)
