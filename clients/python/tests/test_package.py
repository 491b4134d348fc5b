import importlib.metadata
import os

import pytest

import warmpool


def test_the_suite_tests_the_installed_package():
    # test/pysdk installs the client with pip and names the directory: the
    # modules under test must be the ones pip put there, with the metadata
    # pyproject.toml declares (the kubernetes client as a dependency).
    where = os.environ.get("WARMPOOL_TEST_INSTALLED_AT")
    if where is None:
        pytest.skip("run from a source checkout: no installed package to check")
    assert os.path.dirname(os.path.dirname(os.path.abspath(warmpool.__file__))) == os.path.abspath(where)
    dist = importlib.metadata.distribution("warmpool")
    assert any(r.startswith("kubernetes") for r in dist.requires)
    for mod in ("sandbox", "execution", "errors", "oneoff", "rlm", "tools", "_api"):
        assert os.path.exists(os.path.join(where, "warmpool", mod + ".py")), mod
