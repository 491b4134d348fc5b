"""The golden cases of the lost-answer recovery (docs/recovery.md,
pkg/protocol/testdata/recovery.json), run against the scripted data plane
(internal/testing/scriptedplane) that the Go and TypeScript clients run them
against too."""

import json
import os
import pathlib
import subprocess
import urllib.request

import kubernetes
import pytest

from warmpool import errors
from warmpool.sandbox import Sandbox

REPO = pathlib.Path(__file__).resolve().parents[3]
CASES = json.loads((REPO / "pkg/protocol/testdata/recovery.json").read_text())["cases"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    binary = tmp_path_factory.mktemp("plane") / "scriptedplane"
    subprocess.run([os.environ.get("GO", "go"), "build", "-o", str(binary), "./internal/testing/scriptedplane/cmd/scriptedplane"],
                   cwd=REPO, check=True)
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    yield url
    proc.kill()
    proc.wait()


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req).close()


def _outcome(run):
    """The client's answer in the cases' terms."""
    handed = []
    try:
        ex = run(lambda d: handed.append(d))
    except errors.NotRunError:
        return {"error": "not_run"}
    except errors.SessionLostError:
        return {"error": "state_lost"}
    except errors.APIError as e:
        return {"error": "status", "code": e.status}
    out = {"status": ex.status, "stdout": ex.stdout, "handedStdout": "".join(handed)}
    if ex.text is not None:
        out["result"] = ex.text
    return {k: v for k, v in out.items() if v != ""}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recovery_case(plane, case):
    _post(plane + "/_script", case["exchanges"])
    cfg = kubernetes.client.Configuration()
    cfg.host = plane
    sb = Sandbox(kubernetes.client.ApiClient(cfg), "ns", "s")
    got = _outcome(lambda on_stdout: sb.run_code("x", on_stdout=on_stdout))
    want = {k: v for k, v in case["outcome"].items() if v != ""}
    assert got == want
    with urllib.request.urlopen(plane + "/_verdict") as resp:
        verdict = json.load(resp)
    assert not verdict["problems"], verdict
