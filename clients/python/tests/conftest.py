"""The suite runs against a cluster with warmpool deployed (envtest with real
agents, or the local cluster): WARMPOOL_TEST_KUBECONFIG names a kubeconfig of
a user with the Session roles in WARMPOOL_TEST_NAMESPACE, whose pool
WARMPOOL_TEST_POOL is warm. WARMPOOL_TEST_KUBECONFIG_VIEWER names one of a
user who may read Sessions but not create them or run code,
WARMPOOL_TEST_KUBECONFIG_OTHER one of another user with the Session roles
(named sdk-user and sdk-other by the harness). test/pysdk (part
of `make test`) starts warmpool on envtest and runs the suite so."""

import os

import pytest

import warmpool


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run this suite through its harness (see clients/python/README.md)")
    return value


@pytest.fixture(scope="session")
def cluster():
    return {"kubeconfig": _env("WARMPOOL_TEST_KUBECONFIG"), "namespace": _env("WARMPOOL_TEST_NAMESPACE"),
            "pool": _env("WARMPOOL_TEST_POOL"), "viewer_kubeconfig": _env("WARMPOOL_TEST_KUBECONFIG_VIEWER"),
            "other_kubeconfig": _env("WARMPOOL_TEST_KUBECONFIG_OTHER")}


@pytest.fixture
def sandbox(cluster):
    with warmpool.Sandbox.create(cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"]) as sb:
        yield sb
