"""Machine output is pure, and a run says what happened: library logs never reach stdout under --json."""

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def test_run_json_stdout_is_only_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "ditgate", "run", "zoo:flux", "--rows", "cache", "--out",
                           str(tmp_path / "run"), "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert report["passed"] and "[Cache-DiT]" in done.stderr
