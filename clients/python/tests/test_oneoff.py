import kubernetes
import pytest

import warmpool
from warmpool import _api


def _sessions(cluster):
    api, _ = _api.load(cluster["kubeconfig"])
    return kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
        _api.GROUP, _api.VERSION, cluster["namespace"], "sessions")["items"]


def test_run_is_one_request_that_leases_runs_and_closes(cluster):
    out = []
    ex = warmpool.run("import os\nprint(context['k'], os.environ['WHO'])\n6 * 7", cluster["pool"], cluster["namespace"],
                      kubeconfig=cluster["kubeconfig"], timeout=20, context={"k": 1}, envs={"WHO": "me"},
                      on_stdout=out.append)
    assert ex.ok and ex.stdout == "1 me\n" and ex.text == "42" and out == ["1 me\n"]
    mine = [s for s in _sessions(cluster) if (s["metadata"].get("annotations") or {}).get(f"{_api.GROUP}/run") == ex.id]
    assert len(mine) == 1, "the run's temporary Session names the run"
    assert mine[0]["spec"]["owner"] == "sdk-user", "the caller owns it"
    assert mine[0]["spec"].get("close") or mine[0]["status"]["phase"] in ("Closed", "Lost"), "it is closed"


def test_run_answers_llm_query_on_the_host(cluster):
    ex = warmpool.run("llm_query('ping')", cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                      on_llm_query=lambda prompt: prompt.upper())
    assert ex.ok and ex.text == "'PING'"


def test_run_says_the_code_did_not_run_for_a_missing_pool(cluster):
    with pytest.raises(warmpool.PoolNotFoundError):
        warmpool.run("1", "no-such-pool", cluster["namespace"], kubeconfig=cluster["kubeconfig"])


def test_run_via_execution_creates_an_execution_and_returns_its_outcome(cluster):
    ex = warmpool.run("print('hi')\n6 * 7", cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                      timeout=20, context={"k": 1}, via="execution")
    assert ex.ok and ex.stdout == "hi\n" and ex.text == "42"
    assert ex.raw["kind"] == "Execution" and ex.id.startswith("run-")
    assert ex.raw["spec"]["owner"] == "sdk-user", "the creator is recorded"


def test_run_reports_the_codes_error(cluster):
    for via in ("session", "execution"):
        ex = warmpool.run("raise ValueError('bad input')", cluster["pool"], cluster["namespace"],
                          kubeconfig=cluster["kubeconfig"], via=via)
        assert ex.status == "failed", via
        assert ex.error.name == "ValueError" and "bad input" in ex.error.value, via
