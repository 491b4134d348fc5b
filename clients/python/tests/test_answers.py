"""What the client makes of the data plane's other answers (a directory
listing, a variable, a failed request), in the shapes the agent and the
kubernetes client give them. No cluster."""

import datetime
import json

import pytest
from kubernetes.client.exceptions import ApiException

import warmpool
from fakes import Stream
from warmpool import _api

# GET .../files?list=true, as the agent writes protocol.FileInfo.
_LISTING = [
    {"path": "/in/data.txt", "name": "data.txt", "size": 5, "dir": False, "mode": "-rw-r--r--",
     "modTime": "2026-01-02T03:04:05.123456789Z"},
    {"path": "/in/sub", "name": "sub", "size": 4096, "dir": True, "mode": "drwxr-xr-x",
     "modTime": "2026-01-02T03:04:05+02:00"},
]


def _answering(monkeypatch, answer):
    asked = []

    def request(api, method, path, query=None, **_):
        asked.append((method, path.rsplit("/", 1)[-1], query))
        return Stream([], json.dumps(answer).encode())

    monkeypatch.setattr(_api, "request", request)
    return warmpool.Sandbox(None, "ns", "s"), asked


def test_files_list_returns_entries_with_attributes(monkeypatch):
    sb, asked = _answering(monkeypatch, _LISTING)
    f, d = sb.files.list("in")
    assert asked == [("GET", "files", {"path": "in", "list": "true"})]
    assert isinstance(f, warmpool.EntryInfo)
    assert (f.name, f.path, f.size, f.type, f.dir, f.mode) == ("data.txt", "/in/data.txt", 5, "file", False, "-rw-r--r--")
    assert (d.name, d.path, d.type, d.dir, d.mode) == ("sub", "/in/sub", "dir", True, "drwxr-xr-x")
    utc = datetime.timezone.utc
    assert f.modified_time == datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=utc)
    assert d.modified_time == datetime.datetime(2026, 1, 2, 1, 4, 5, tzinfo=utc)
    # Callers that read the dicts keep working.
    assert f["name"] == "data.txt" and d["dir"] is True and f == _LISTING[0]
    assert json.loads(json.dumps([f, d])) == _LISTING
    assert repr(f) == "EntryInfo(name='data.txt', type='file', path='/in/data.txt', size=5)"


def test_a_variable_with_an_empty_repr_does_not_say_none(monkeypatch):
    sb, _ = _answering(monkeypatch, {"name": "blank", "type": "Blank"})  # repr "" is left out
    with pytest.raises(ValueError) as e:
        sb.get_variable("blank")
    assert str(e.value) == "blank (Blank) is not JSON-serialisable: its repr is empty"
    sb, _ = _answering(monkeypatch, {"name": "lock", "type": "lock", "repr": "<unlocked _thread.lock object>"})
    with pytest.raises(ValueError) as e:
        sb.get_variable("lock")
    assert str(e.value) == "lock (lock) is not JSON-serialisable: <unlocked _thread.lock object>"


def test_a_request_that_got_no_http_answer_says_why_without_a_status():
    # What the kubernetes client raises when TLS fails: status 0, no body.
    e = _api.api_error(ApiException(status=0, reason="SSLError\ncertificate verify failed"))
    assert type(e) is warmpool.APIError and e.status == 0
    assert str(e) == "SSLError\ncertificate verify failed"
    assert str(warmpool.APIError(404, "NotFound", "sessions \"x\" not found")) == '404 NotFound: sessions "x" not found'
    assert str(warmpool.APIError(502, "", "agent unreachable")) == "502: agent unreachable"
    assert str(warmpool.APIError(500, "Internal Server Error", "")) == "500 Internal Server Error"
