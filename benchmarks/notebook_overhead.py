"""What a phase notebook costs over calling the library directly: same phase, same model, each in a fresh process.

    python benchmarks/notebook_overhead.py [--phase baseline] [--model zoo:flux] [--repeats 3]

Alternates, `--repeats` times: (a) `papermill notebooks/NN_phase.ipynb` (papermill's start, the kernel's start, the
imports inside the kernel, the phase, the display and the JSON result), and (b) `python -c` calling
`ditgate.run.runner.run` with the same rows and request (the interpreter, the imports, the phase). Prints each wall
time, the runner's own wall time of each (report.json `wall_s`), and the medians of both and of their difference
(the time spent outside the runner: process and kernel start, imports, display, results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRECT = """
import sys
from pathlib import Path
from ditgate import notebooks
from ditgate.core.model import Model
from ditgate.run.runner import RunConfig, run
phase, model, out = sys.argv[1:4]
cfg = RunConfig(model=Model.open(model), rows=notebooks.phase_rows(phase), out=Path(out) / phase)
run(cfg, progress=lambda line: None)
"""


def _timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", default="baseline")
    parser.add_argument("--model", default="zoo:flux")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel", default="ditgate")
    args = parser.parse_args()
    from ditgate import zoo
    from ditgate import notebooks

    zoo.materialize(args.model) if args.model.startswith("zoo:") else None  # built once, outside the timings
    nb = notebooks.find(args.phase)[0]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    times: dict[str, list[float]] = {"papermill": [], "direct": []}
    inner: dict[str, list[float]] = {"papermill": [], "direct": []}
    with tempfile.TemporaryDirectory(prefix="nb-overhead-") as tmp:
        for i in range(args.repeats):
            for how in ("papermill", "direct"):
                out = Path(tmp) / f"{how}-{i}"
                out.mkdir()
                if how == "papermill":
                    command = [sys.executable, "-m", "papermill", str(nb.path), str(out / f"{nb.stem}.ipynb"),
                               "-k", args.kernel, "-p", "model", args.model, "-p", "out", str(out)]
                else:
                    command = [sys.executable, "-c", DIRECT, nb.phase, args.model, str(out)]
                times[how].append(_timed(command, env))
                inner[how].append(json.loads((out / nb.phase / "report.json").read_text())["wall_s"])
                print(f"{how:<9} run {i + 1}: {times[how][-1]:6.1f} s  (runner wall_s {inner[how][-1]:.1f} s)",
                      flush=True)
    median = {how: statistics.median(values) for how, values in times.items()}
    around = {how: statistics.median(t - w for t, w in zip(times[how], inner[how])) for how in times}
    print(f"median wall: papermill {median['papermill']:.1f} s, direct {median['direct']:.1f} s: the notebook adds "
          f"{median['papermill'] - median['direct']:.1f} s")
    print(f"median time outside the runner (wall - wall_s): papermill {around['papermill']:.1f} s, direct "
          f"{around['direct']:.1f} s: the notebook adds {around['papermill'] - around['direct']:.1f} s")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
