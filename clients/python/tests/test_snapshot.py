import hashlib
import json
import os
import pickle
import struct
import zlib

import kubernetes
import pytest

import warmpool
from warmpool import _api


def test_snapshot_fork_into_three_and_each_goes_on_alone(cluster, sandbox):
    sandbox.run_code("x = 40\ndef bump(n):\n    global x\n    x += n\n    return x\nclass Box:\n    pass\nb = Box(); b.v = 'box'")
    snap = sandbox.snapshot()
    assert snap.variables["x"] == "int" and snap.variables["bump"] == "function" and snap.variables["b"] == "Box"
    assert snap.skipped == {} and snap.python.startswith("3.")

    forks = sandbox.fork(3)
    try:
        assert len({f.name for f in forks}) == 3
        for i, f in enumerate(forks):
            assert f.get()["metadata"]["annotations"]["sandbox.warmpool.dev/forked-from"] == sandbox.name
            assert "sandbox.warmpool.dev/restoring" not in f.get()["metadata"]["annotations"]
            assert f.run_code(f"bump({i + 1})").text == str(40 + i + 1)
        # Each fork has its own state, and the source is where it was.
        assert [f.run_code("x, b.v").text for f in forks] == ["(41, 'box')", "(42, 'box')", "(43, 'box')"]
        assert sandbox.run_code("x").text == "40"
    finally:
        for f in forks:
            f.close()


def test_create_from_a_snapshot_and_what_cannot_be_saved_is_named(cluster, sandbox, tmp_path):
    sandbox.run_code("import socket, json as j\nkept = {'a': [1, 2]}\nsock = socket.socket()\nopen('f.txt', 'w').write('file')")
    snap = sandbox.snapshot(workspace=True)
    assert "socket" in snap.skipped["sock"] and "kept" in snap.variables and snap.modules["j"] == "json"
    snap.save(tmp_path / "s.wpsnap")
    again = warmpool.Snapshot.load(tmp_path / "s.wpsnap")
    with warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                                 snapshot=again) as sb:
        assert sb.run_code("kept['a'], j.dumps(1), 'sock' in globals()").text == "([1, 2], '1', False)"
        assert sb.files.read("f.txt") == "file"


def test_a_session_waiting_for_its_state_runs_nothing(cluster, sandbox):
    api, _ = _api.load(cluster["kubeconfig"])
    objects = kubernetes.client.CustomObjectsApi(api)
    body = {"apiVersion": "sandbox.warmpool.dev/v1alpha1", "kind": "Session",
            "metadata": {"generateName": "waiting-", "annotations": {"sandbox.warmpool.dev/restoring": "caller"}},
            "spec": {"poolRef": {"name": cluster["pool"]}}}
    obj = objects.create_namespaced_custom_object("sandbox.warmpool.dev", "v1alpha1", cluster["namespace"], "sessions", body)
    sb = warmpool.Sandbox(api, cluster["namespace"], obj["metadata"]["name"])
    try:
        sb._wait_ready(obj, 60)
        with pytest.raises(warmpool.APIError, match="waiting for its state") as e:
            sb.run_code("1")
        assert e.value.status == 409
        sandbox.run_code("y = 7")
        sb.restore(sandbox.snapshot())
        assert sb.run_code("y").text == "7"
    finally:
        sb.close()


class _Hostile:
    def __reduce__(self):
        return (exec, ("open('pwned.txt', 'w').write('ran in the sandbox')",))


def _hostile_snapshot(python):
    payload = zlib.compress(pickle.dumps({"h": _Hostile()}))
    manifest = {"format": 1, "created": "2026-01-01T00:00:00Z", "python": python, "serializer": "pickle",
                "compression": "zlib", "variables": [{"name": "h", "type": "NoneType"}],
                "sections": [{"name": "namespace", "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}]}
    m = json.dumps(manifest).encode()
    return b"WPSNAP1\n" + struct.pack(">I", len(m)) + m + payload


def test_a_hostile_snapshot_runs_only_in_the_sandbox_it_is_restored_into(cluster, sandbox, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = _hostile_snapshot(sandbox.snapshot().python)
    # The client reads the manifest and nothing else: the pickle does not run here.
    snap = warmpool.Snapshot(data)
    assert snap.variables == {"h": "NoneType"}
    assert not os.path.exists("pwned.txt")
    # Restored, it runs in the sandbox, where the code could run anyway.
    sandbox.restore(snap)
    assert sandbox.files.read("pwned.txt") == "ran in the sandbox"
    assert not os.path.exists("pwned.txt")


def test_bytes_that_are_not_a_snapshot_are_refused(cluster, sandbox):
    with pytest.raises(ValueError, match="not a warmpool snapshot"):
        warmpool.Snapshot(b"hello")
    snap = sandbox.snapshot()
    torn = snap.data[:-5] + bytes(5)
    with pytest.raises(warmpool.APIError, match="SHA-256") as e:
        sandbox.restore(torn)
    assert e.value.status == 400
