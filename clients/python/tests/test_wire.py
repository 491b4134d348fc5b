"""The client against the wire contract's golden streams (pkg/protocol/testdata):
what the agent streams, as the data plane relays it, read by run_code. No
cluster: the data plane's answers are the golden files."""

import json

import pytest

import warmpool
from fakes import GOLDEN, Stream
from warmpool import _api


def _run(monkeypatch, name, **kwargs):
    sb, posted = _sandbox(monkeypatch, name)
    return sb.run_code("ignored: the stream is the golden one", **kwargs), posted


def _sandbox(monkeypatch, name):
    """A Sandbox whose every run streams the golden stream ``name``."""
    lines = (GOLDEN / f"{name}.ndjson").read_bytes().splitlines(keepends=True)
    posted = []

    def request(api, method, path, body=None, accept="application/json", **_):
        if path.endswith("/exec"):
            return Stream(lines)
        posted.append((path.rsplit("/", 1)[-1], body))
        return Stream([])

    monkeypatch.setattr(_api, "request", request)
    return warmpool.Sandbox(None, "ns", "s"), posted


def test_every_golden_stream_is_known():
    names = sorted(p.stem for p in GOLDEN.glob("*.ndjson"))
    assert names == ["bridge", "error", "final", "interpreter-restarted", "killed", "output-and-result", "shell",
                     "stderr", "timed-out"]
    for p in GOLDEN.glob("*.ndjson"):
        for line in p.read_text().splitlines():
            assert json.loads(line)["type"] in ("stdout", "stderr", "bridge", "result"), p.name


def test_output_and_result(monkeypatch):
    out = []
    ex, _ = _run(monkeypatch, "output-and-result", on_stdout=out.append)
    assert ex.ok and ex.status == "succeeded" and ex.text == "42" and ex.stdout == "out\n" and out == ["out\n"]


def test_stderr(monkeypatch):
    err = []
    ex, _ = _run(monkeypatch, "stderr", on_stderr=err.append)
    assert ex.stderr == "err\n" and err == ["err\n"]


def test_bridge_is_answered(monkeypatch):
    ex, posted = _run(monkeypatch, "bridge", on_llm_query=lambda prompt: "four" if prompt == "2+2?" else "?")
    assert ex.text == "'four'"
    assert posted == [("bridge", {"id": posted[0][1]["id"], "call": "call-1", "result": "four"})]


def test_error(monkeypatch):
    ex, _ = _run(monkeypatch, "error")
    assert ex.status == "failed" and ex.error.name == "ZeroDivisionError" and ex.error.value == "division by zero"
    assert ex.error.traceback.startswith("Traceback")


def test_final(monkeypatch):
    ex, _ = _run(monkeypatch, "final")
    assert ex.final and ex.text == "the answer"


def test_timed_out(monkeypatch):
    ex, _ = _run(monkeypatch, "timed-out")
    assert ex.status == "timed_out" and ex.stdout == "started\n" and ex.error.name == "KeyboardInterrupt"


@pytest.mark.parametrize("timeout,says", [(None, "the sandbox's timeout"), (0, "the sandbox's timeout"), (2, "2s"),
                                          (2.0, "2s"), (0.25, "0.25s"), (90, "90s")])
def test_the_tool_says_how_long_a_timed_out_call_ran(monkeypatch, timeout, says):
    sb, _ = _sandbox(monkeypatch, "timed-out")
    out = json.loads(warmpool.python_tool(sb, timeout=timeout)("while True: pass"))
    assert out["stdout"] == "started\n" and out["error"]["name"] == "KeyboardInterrupt"
    assert out["error"]["value"] == f"the code ran longer than {says} and was interrupted"


def test_shell(monkeypatch):
    ex, _ = _run(monkeypatch, "shell")
    assert ex.status == "failed" and ex.stdout == "hi\n" and ex.raw["exitCode"] == 3


@pytest.mark.parametrize("name,kind", [("killed", "InterpreterKilled"), ("interpreter-restarted", "InterpreterRestarted")])
def test_lost_state_is_an_error_that_says_so(monkeypatch, name, kind):
    with pytest.raises(warmpool.SessionLostError) as e:
        _run(monkeypatch, name)
    assert e.value.execution.error.name == kind and e.value.execution.state_lost
