import os
import sys
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
