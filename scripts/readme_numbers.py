"""The README's numbers about the test suite and the main job, measured here and written into README.md between
the `<!-- readme-numbers -->` markers, so that the README never quotes an old test count or run time.

    python scripts/readme_numbers.py            measure, rewrite the block, print it
    python scripts/readme_numbers.py --check    exit 1 when the block's test counts differ from the suite's now
    python scripts/readme_numbers.py --ci-log FILE   also quote the times `.ci/run` printed into FILE

Measured: the tests of each tier (`pytest --collect-only`), and the wall time of `ditgate run zoo:flux` and
`ditgate run zoo:wan` in a fresh process each (the zoo models built beforehand, so building is not counted), with
the machine's core count and torch build. The times depend on the machine and on what else runs on it; the block
says where and when they were taken.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- readme-numbers:start -->", "<!-- readme-numbers:end -->"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_counts() -> dict[str, int]:
    """Tests collected in the fast tier and in all (pytest --collect-only -q)."""
    counts = {}
    for tier, marker in (("fast", ["-m", "not full"]), ("all", [])):
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *marker], cwd=ROOT,
                              env=_env(), capture_output=True, text=True)
        found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", done.stdout)
        if not found:
            raise SystemExit(f"pytest --collect-only gave no count:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        counts[tier] = int(found.group(1))
    return counts


def run_time(model: str) -> dict[str, float]:
    """`ditgate run MODEL` in a fresh process: (the command's wall time, the report's wall time, rows)."""
    with tempfile.TemporaryDirectory(prefix="ditgate-readme-") as folder:
        subprocess.run([sys.executable, "-m", "ditgate", "zoo", "build", model.removeprefix("zoo:"),
                        str(Path(folder) / "warm")], env=_env(), check=True, capture_output=True)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ditgate", "run", model, "--out", str(Path(folder) / "run"),
                               "-q", "--json"], env=_env(), capture_output=True, text=True, cwd=folder)
        command = time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"ditgate run {model} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        report = json.loads(done.stdout)
        return {"command_s": round(command, 1), "report_s": round(report["wall_s"], 1), "rows": len(report["rows"]),
                "passed": report["passed"]}


def ci_times(log: Path) -> str | None:
    text = log.read_text()
    install = re.search(r"CI: install took (\d+) s", text)
    finished = re.search(r"CI: tests took (\d+) s; CI finished in (\d+) s", text)
    if not (install and finished):
        return None
    return (f"`bash .ci/run` (log {log.name}): install {install.group(1)} s, tests {finished.group(1)} s, "
            f"{finished.group(2)} s in all")


def block(counts: dict[str, int], times: dict[str, dict[str, float]], ci: str | None) -> str:
    import torch

    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [START,
             f"Measured by `python scripts/readme_numbers.py` on {when}, {os.cpu_count()} CPU cores (load average "
             f"{load:.1f} when it ended: other work on the machine slows the times), torch {torch.__version__}:",
             f"- tests: {counts['fast']} in the fast tier (`bash scripts/test.sh`, what CI runs), {counts['all']} in "
             "all (`--full`);"]
    for model, t in times.items():
        lines.append(f"- `ditgate run {model}` (every default row, {t['rows']} rows recorded, "
                     f"{'all passed' if t['passed'] else 'NOT all passed'}): {t['command_s']} s from the command to "
                     f"the report, {t['report_s']} s inside the runner;")
    if ci:
        lines.append(f"- {ci}")
    lines[-1] = lines[-1].rstrip(";") + "."
    return "\n".join(lines + [END])


def _current(text: str) -> str | None:
    found = re.search(re.escape(START) + r".*?" + re.escape(END), text, re.S)
    return found.group(0) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare the test counts only; write nothing")
    parser.add_argument("--ci-log", type=Path, help="a log of `bash .ci/run` to quote its times from")
    args = parser.parse_args(argv)
    text = README.read_text()
    current = _current(text)
    if current is None:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    counts = test_counts()
    if args.check:
        quoted = re.search(r"tests: (\d+) in the fast tier .*?, (\d+) in\s+all", current, re.S)
        now = (counts["fast"], counts["all"])
        if not quoted or (int(quoted.group(1)), int(quoted.group(2))) != now:
            print(f"README.md quotes {quoted.groups() if quoted else 'no'} test counts; the suite has {now}: run "
                  "python scripts/readme_numbers.py", file=sys.stderr)
            return 1
        return 0
    times = {model: run_time(model) for model in ("zoo:flux", "zoo:wan")}
    new = block(counts, times, ci_times(args.ci_log) if args.ci_log else None)
    tmp = README.with_name(".README.md.tmp")
    tmp.write_text(text.replace(current, new))
    tmp.replace(README)
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
