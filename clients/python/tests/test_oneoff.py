import warmpool


def test_run_creates_an_execution_and_returns_its_outcome(cluster):
    ex = warmpool.run("print('hi')\n6 * 7", cluster["pool"], cluster["namespace"], kubeconfig=cluster["kubeconfig"],
                      timeout=20, context={"k": 1})
    assert ex.ok and ex.stdout == "hi\n" and ex.text == "42"
    assert ex.raw["kind"] == "Execution" and ex.id.startswith("run-")
    assert ex.raw["spec"]["owner"] == "sdk-user", "the creator is recorded"


def test_run_reports_the_codes_error(cluster):
    ex = warmpool.run("raise ValueError('bad input')", cluster["pool"], cluster["namespace"],
                      kubeconfig=cluster["kubeconfig"])
    assert ex.status == "failed"
    assert ex.error.name == "ValueError" and "bad input" in ex.error.value
