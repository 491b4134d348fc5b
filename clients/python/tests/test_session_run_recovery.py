"""Sandbox.run_code's answer to a lost answer (a data-plane replica that
stopped, a connection that broke), against the data plane's wire: the run is
looked up by its ID and picked up, or sent again only when its agent never
heard of it. No cluster."""

import json

import pytest
import urllib3

import warmpool
from fakes import Stream
from warmpool import _api, recovery
from warmpool.sandbox import Sandbox


class _Wire:
    """/exec answers from ``execs`` in turn (an exception is raised, bytes are
    streamed), /executions from ``states`` (the last one repeats)."""

    def __init__(self, execs, states):
        self.execs, self.states, self.sent = list(execs), list(states), []

    def request(self, api, method, path, query=None, body=None, **kw):
        sub = path.rsplit("/", 1)[-1]
        self.sent.append((sub, body))
        if sub == "executions":
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            if isinstance(state, Exception):
                raise state
            return Stream([], json.dumps(state).encode())
        if sub == "exec":
            answer = self.execs.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return Stream(answer.splitlines(keepends=True))
        raise AssertionError(f"unexpected {method} {path}")

    def execs_sent(self):
        return [b for sub, b in self.sent if sub == "exec"]


@pytest.fixture
def wire(monkeypatch):
    def make(execs, states):
        w = _Wire(execs, states)
        monkeypatch.setattr(_api, "request", w.request)
        monkeypatch.setattr(recovery, "RECOVER_GRACE", 0.05)
        return w
    return make


def _sandbox():
    return Sandbox(None, "ns", "s")


def test_a_stream_cut_before_its_result_is_picked_up_by_its_id(wire):
    # An attach gets the run's result only (live output goes to the caller
    # that started it): what the cut stream did not bring comes from it.
    cut = b'{"type":"stdout","data":"out\\n"}\n{"type":"std'
    result = b'{"type":"result","result":{"id":"x","status":"succeeded","stdout":"out\\nmore\\n","stderr":"","result":"42"}}\n'
    w = wire([cut, result], [{"id": "x", "running": True}])
    out = []
    ex = _sandbox().run_code("print('out')\nprint('more')\n42", on_stdout=out.append)
    assert ex.ok and ex.text == "42"
    assert "".join(out) == "out\nmore\n", "each line once"
    sent = w.execs_sent()
    assert len(sent) == 2 and sent[0]["id"] == sent[1]["id"], "attached by the same ID, never sent anew"
    assert [s for s, _ in w.sent] == ["exec", "executions", "exec"]


def test_a_run_that_never_reached_its_agent_is_sent_again_with_its_id(wire):
    gone = warmpool.APIError(502, "", "error trying to reach service: dial tcp: connection refused")
    result = b'{"type":"result","result":{"id":"x","status":"succeeded","stdout":"","stderr":"","result":"7"}}\n'
    w = wire([gone, result], [warmpool.NotFoundError(404, "NotFound", "execution not found")])
    ex = _sandbox().run_code("7")
    assert ex.ok and ex.text == "7"
    sent = w.execs_sent()
    assert len(sent) == 2 and sent[0]["id"] == sent[1]["id"]


def test_a_run_that_ended_is_not_sent_again(wire):
    w = wire([urllib3.exceptions.ProtocolError("connection reset")],
             [{"id": "x", "result": {"id": "x", "status": "succeeded", "stdout": "", "stderr": "", "result": "3"}}])
    ex = _sandbox().run_code("3")
    assert ex.ok and ex.text == "3"
    assert len(w.execs_sent()) == 1


def test_a_refusal_before_the_run_is_not_retried(wire):
    w = wire([warmpool.APIError(409, "Conflict", "a run is under way")], [{}])
    with pytest.raises(warmpool.APIError):
        _sandbox().run_code("1")
    assert [s for s, _ in w.sent] == ["exec"]


def test_a_refusal_by_an_unready_replica_is_sent_again_without_asking(wire, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    unready = warmpool.APIError(503, "ServiceUnavailable", "this manager replica has not loaded the agent signing keys yet")
    result = b'{"type":"result","result":{"id":"x","status":"succeeded","stdout":"","stderr":"","result":"5"}}\n'
    w = wire([unready, unready, result], [{}])
    ex = _sandbox().run_code("5")
    assert ex.ok and ex.text == "5"
    assert [s for s, _ in w.sent] == ["exec", "exec", "exec"], "never asked about: it did not run"


def test_a_run_whose_connection_was_refused_is_tried_again_and_never_asked_about(wire, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    refused = urllib3.exceptions.NewConnectionError(None, "connection refused")
    w = wire([refused] * 4, [{}])
    with pytest.raises(urllib3.exceptions.NewConnectionError):
        _sandbox().run_code("1")
    assert [s for s, _ in w.sent] == ["exec"] * 4


def test_a_run_sent_again_that_attaches_hands_on_its_output(wire, monkeypatch):
    # A 503 can come from a replica that went away after forwarding the run:
    # sent again with its ID, it attaches, and the answer is the result alone.
    monkeypatch.setattr("time.sleep", lambda s: None)
    unready = warmpool.APIError(503, "ServiceUnavailable", "no endpoints available")
    result = b'{"type":"result","result":{"id":"x","status":"succeeded","stdout":"step 1\\n","stderr":"","result":"1"}}\n'
    w = wire([unready, result], [{"id": "x", "running": True}])
    out = []
    ex = _sandbox().run_code("print('step 1')\n1", on_stdout=out.append)
    assert ex.ok and ex.text == "1"
    assert "".join(out) == "step 1\n", "the output reaches the handler once"
    assert len(w.execs_sent()) == 2
