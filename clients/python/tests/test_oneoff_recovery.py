"""warmpool.run's answer to a lost one-call answer, against the data plane's
wire (the golden streams of pkg/protocol/testdata): the run is looked up by
its ID, attached to or reported as not run, never sent twice. No cluster."""

import json

import pytest
import urllib3

import warmpool
from fakes import GOLDEN, Stream
from warmpool import _api, oneoff, recovery


class _Wire:
    """The data plane as the client sees it: /runs fails as told, the run's
    state answers as told, and every request is recorded."""

    def __init__(self, runs_error, state):
        self.runs_error, self.state, self.sent = runs_error, state, []
        self.attach_errors = []
        self.timeouts = []

    def request(self, api, method, path, query=None, body=None, **kw):
        sub = "runs" if "/runs/" in path else path.rsplit("/", 1)[-1]
        self.sent.append((method, sub, body))
        self.timeouts.append((sub, kw.get("timeout")))
        if sub == "runs":
            raise self.runs_error
        if sub == "executions":
            state = self.state.pop(0) if len(self.state) > 1 else self.state[0]
            if isinstance(state, Exception):
                raise state
            return Stream([], json.dumps(state).encode())
        if sub == "exec":  # an attach: the run's events from the start, as the agent replays them
            if self.attach_errors:
                raise self.attach_errors.pop(0)
            return Stream((GOLDEN / "output-and-result.ndjson").read_bytes().splitlines(keepends=True))
        raise AssertionError(f"unexpected {method} {path}")


@pytest.fixture
def wire(monkeypatch):
    def make(runs_error, state):
        w = _Wire(runs_error, state)
        monkeypatch.setattr(_api, "request", w.request)
        monkeypatch.setattr(recovery, "RECOVER_GRACE", 0.05)
        monkeypatch.setattr(oneoff, "_close", lambda sb: w.sent.append(("close", sb.name, None)))
        return w
    return make


def _run():
    return oneoff._run_once(None, "ns", "print('out')\n42", "py", timeout=None, context=None, envs=None, name="run-",
                            wait=60, on_stdout=None, on_stderr=None, on_llm_query=None, on_rlm_query=None)


def test_a_run_still_going_is_attached_to_and_its_result_returned(wire):
    w = wire(urllib3.exceptions.ProtocolError("connection reset"), [{"id": "x", "running": True}])
    ex = _run()
    assert ex.ok and ex.text == "42" and ex.stdout == "out\n"
    runs = [b for m, sub, b in w.sent if sub == "runs"]
    attach = [b for m, sub, b in w.sent if sub == "exec"]
    assert len(runs) == 1 and len(attach) == 1 and attach[0]["id"] == runs[0]["id"], "attached by the same ID"
    assert attach[0]["code"] == runs[0]["code"] and "pool" not in attach[0]
    assert ex.id == runs[0]["id"]
    assert w.sent[-1][0] == "close", "the Session is closed after"


def test_a_run_that_ended_returns_its_result_without_sending_it_again(wire):
    result = {"status": "succeeded", "stdout": "out\n", "result": "42"}
    w = wire(urllib3.exceptions.ProtocolError("connection reset"), [{"id": "x", "running": False, "result": result}])
    ex = _run()
    assert ex.ok and ex.text == "42"
    assert not [s for _, s, _ in w.sent if s == "exec"], "never sent again"


def test_a_run_its_agent_never_heard_of_did_not_run(wire):
    w = wire(urllib3.exceptions.ProtocolError("connection reset"),
             [warmpool.NotFoundError(404, "NotFound", "execution not found")])
    with pytest.raises(warmpool.NotRunError) as e:
        _run()
    assert e.value.session.startswith("run-")
    assert not [s for _, s, _ in w.sent if s == "exec"], "never sent again"
    assert w.sent[-1][0] == "close"


def test_a_refusal_before_the_run_is_not_run_and_asks_nothing(wire):
    w = wire(warmpool.APIError(504, "Timeout", "Session run-x was not Ready within 5m0s; the code has not run"), [{}])
    with pytest.raises(warmpool.NotRunError):
        _run()
    assert [s for _, s, _ in w.sent] == ["runs"]


def test_an_attach_that_reaches_the_gone_replica_is_asked_again(wire):
    w = wire(urllib3.exceptions.ProtocolError("connection reset"), [{"id": "x", "running": True}])
    w.attach_errors = [warmpool.APIError(503, "", "error trying to reach service: dial tcp: connection refused")]
    ex = _run()
    assert ex.ok and ex.text == "42" and ex.stdout == "out\n"
    attach = [b for m, sub, b in w.sent if sub == "exec"]
    runs = [b for m, sub, b in w.sent if sub == "runs"]
    assert len(attach) == 2 and all(a["id"] == runs[0]["id"] for a in attach), "attached again by the same ID, never sent anew"


def test_a_question_that_hangs_is_given_up_and_asked_again(wire):
    # The API server's proxy sent the first question to the killed replica's
    # address, which answered nothing: it ends at its own timeout.
    hung = urllib3.exceptions.ReadTimeoutError(None, "/executions", "read timed out")
    w = wire(urllib3.exceptions.ProtocolError("connection reset"),
             [hung, {"id": "x", "result": {"id": "x", "status": "succeeded", "stdout": "out\n", "stderr": "", "result": "42"}}])
    ex = _run()
    assert ex.ok and ex.text == "42"
    asked = [t for sub, t in w.timeouts if sub == "executions"]
    assert len(asked) == 2 and all(t == recovery.ASK_TIMEOUT for t in asked)
    assert len([b for m, sub, b in w.sent if sub == "runs"]) == 1
