"""-q / -v on every command: a passing run with -q prints nothing (not a byte, on either stream, its ranks
included); a user error is one line on stderr, with no library message before it; --json output is printed even
with -q; library messages come back with -v."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cli(capfd):
    """Run `ditgate ARGS...` in-process; (exit code, stdout, stderr) as the file descriptors saw them."""
    from ditgate.cli import main

    def _run(*args):
        capfd.readouterr()
        code = main([str(a) for a in args])
        sys.stdout.flush()
        sys.stderr.flush()
        out = capfd.readouterr()
        return code, out.out, out.err

    return _run


def test_every_command_takes_q_and_v():
    from ditgate.cli import build_parser

    parser = build_parser()
    for argv in (["zoo", "list"], ["notebook", "list"], ["lint"], ["skill", "install", "--target", "x"],
                 ["run", "zoo:flux"], ["matrix", "zoo:flux"], ["gate", "--phase", "cache", "a", "b"]):
        for flag, key, count in (("-q", "quiet", 1), ("-vv", "verbose", 2)):
            args = parser.parse_args([*argv, flag])
            assert getattr(args, key) == count, (argv, flag)


def test_quiet_passing_run_prints_nothing(cli, tmp_path):
    code, out, err = cli("run", "zoo:flux", "--rows", "cp-ulysses-2", "--out", tmp_path / "run", "-q")
    assert code == 0
    assert out == "" and err == "", (out, err)
    assert (tmp_path / "run" / "report.md").is_file()


def test_quiet_prints_the_output_of_a_failure_and_json_always(cli, tmp_path):
    rng = np.random.default_rng(0)
    base = rng.random((32, 32, 3), dtype=np.float32)
    np.save(tmp_path / "a.npy", base)
    np.save(tmp_path / "b.npy", np.clip(base + 0.2 * rng.random(base.shape, dtype=np.float32), 0, 1))
    code, out, err = cli("gate", "--phase", "cp", tmp_path / "a.npy", tmp_path / "b.npy", "--modality", "image", "-q")
    assert code == 1 and "FAIL" in out.upper()
    code, out, err = cli("gate", "--phase", "cp", tmp_path / "a.npy", tmp_path / "a.npy", "--modality", "image", "-q")
    assert code == 0 and out == "" and err == ""
    code, out, err = cli("gate", "--phase", "cp", tmp_path / "a.npy", tmp_path / "a.npy", "--modality", "image", "-q",
                         "--json")
    assert code == 0 and out.lstrip().startswith("{")


def test_a_user_error_is_one_line_with_no_library_message_before_it():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run([sys.executable, "-m", "ditgate", "matrix", "zoo:flux", "--rows", "no-such-row"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("ditgate: error: unknown row(s) no-such-row"), \
        done.stderr
    assert done.stdout == ""


def test_verbose_lets_library_warnings_through():
    import logging

    from ditgate.core import logs

    try:
        logs.set_verbosity(0)
        assert logging.getLogger("diffusers").getEffectiveLevel() == logging.ERROR
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        logs.set_verbosity(2)
        assert logging.getLogger("diffusers").getEffectiveLevel() == logging.INFO
        assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    finally:
        logs.set_verbosity(0)
