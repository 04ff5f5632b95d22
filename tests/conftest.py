import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # One zoo cache per test session, never the user's; hub access is off for every test.
    if "DITGATE_HOME" not in os.environ:
        import tempfile

        os.environ["DITGATE_HOME"] = tempfile.mkdtemp(prefix="ditgate-test-home-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # every test's run computes its rows unless it asks for reuse (tests/test_reuse.py does)
    os.environ.setdefault("DITGATE_REUSE", "off")


@pytest.fixture(scope="session")
def zoo_path():
    """Folder of a zoo model, built once per session: zoo_path("flux")."""
    from ditgate import zoo

    return lambda name: zoo.materialize(name)


@pytest.fixture()
def run_cli(capsys):
    """Run `ditgate ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from ditgate.cli import main

    def _run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


def _default_run(tmp_path_factory, model: str):
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.runner import RunConfig, run

    out = tmp_path_factory.mktemp(model.removeprefix("zoo:") + "-default") / "run"
    cfg = RunConfig(model=Model.open(model), rows=rows.select(rows.DEFAULT_ROWS, None), out=out)
    return run(cfg, progress=lambda line: None), out


@pytest.fixture(scope="session")
def flux_default_run(tmp_path_factory):
    """Every default row of `ditgate run` on zoo:flux, run once per session: (report, run folder).

    tests/test_runner.py checks this run; the notebook route (tests/test_notebooks.py) and the phase checklists
    (tests/test_checklists.py) resume from copies of it, so the suite runs the default rows on zoo:flux live once."""
    return _default_run(tmp_path_factory, "zoo:flux")


@pytest.fixture(scope="session")
def wan_default_run(tmp_path_factory):
    """The same on zoo:wan (video): checked by tests/test_runner.py, resumed by the Wan CP notebook test."""
    return _default_run(tmp_path_factory, "zoo:wan")
