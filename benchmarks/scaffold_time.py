"""How long `ditgate scaffold MODEL` takes with its rows, against the rows alone, side by side in one run.

Runs, as a user would (a fresh command each, timed from the outside):
1. `ditgate scaffold MODEL --out PLUGIN --run-dir OUT/scaffold` (inspect on the call, write the plugin, run its rows);
2. `ditgate run MODEL --rows ROWS --integration PLUGIN --out OUT/rows` (the same rows with the written plugin).
Prints each wall time, the ratio (what inspecting and writing add to the rows), every row's verdict in both runs,
and the load average before and after (the machine is shared: read the numbers with the load beside them). Both
commands run with the result store off (`DITGATE_REUSE=off`), so neither reuses stored reference rows.
The target (issue 34) is scaffold + rows within 2 minutes on the 2-core CPU for a zoo model.

    python benchmarks/scaffold_time.py zoo:wan
    python benchmarks/scaffold_time.py zoo:pipe/nucleusmoe --out /tmp/scaffold_time

Everything goes to OUT/scaffold_time.json as well.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROWS = "cache,cp-ulysses-2,tp-2"


def _timed(cmd: list[str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - start, proc.returncode, proc.stderr[-3000:] + proc.stdout[-3000:]


def _verdicts(run_dir: Path) -> dict[str, str]:
    path = run_dir / "report.json"
    if not path.is_file():
        return {}
    return {r["name"]: r.get("status") for r in json.loads(path.read_text()).get("rows", [])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rows", default=ROWS)
    parser.add_argument("--out", default="/tmp/scaffold_time")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plugin = out / "plugin.py"
    ditgate = [sys.executable, "-m", "ditgate"]
    os.environ["DITGATE_REUSE"] = "off"  # each command computes every row (no stored reference rows reused)
    load_before = os.getloadavg()
    scaffold_s, scaffold_rc, scaffold_tail = _timed(
        ditgate + ["scaffold", args.model, "--out", str(plugin), "--rows", args.rows, "--run-dir",
                   str(out / "scaffold"), *extra])
    rows_s, rows_rc, rows_tail = _timed(
        ditgate + ["run", args.model, "--rows", args.rows, "--integration", str(plugin), "--out", str(out / "rows"),
                   "--dtype", "float32", "-q", *extra])
    load_after = os.getloadavg()
    result = {"model": args.model, "rows": args.rows, "scaffold_s": round(scaffold_s, 1),
              "scaffold_exit": scaffold_rc, "rows_s": round(rows_s, 1), "rows_exit": rows_rc,
              "ratio": round(scaffold_s / rows_s, 2) if rows_s else None,
              "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
              "cpus": os.cpu_count(), "verdicts_scaffold": _verdicts(out / "scaffold"),
              "verdicts_rows": _verdicts(out / "rows"), "target_s": 120,
              "tails": {"scaffold": scaffold_tail, "rows": rows_tail}}
    (out / "scaffold_time.json").write_text(json.dumps(result, indent=2))
    print(f"| model | scaffold + rows | rows alone | ratio | load before -> after | verdicts |")
    print("|---|---|---|---|---|---|")
    verdicts = ", ".join(f"{k} {v}" for k, v in result["verdicts_scaffold"].items())
    print(f"| {args.model} | {scaffold_s:.0f} s (exit {scaffold_rc}) | {rows_s:.0f} s (exit {rows_rc}) | "
          f"{result['ratio']} | {load_before[0]:.1f} -> {load_after[0]:.1f} | {verdicts} |")
    return 0 if scaffold_rc == 0 and rows_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
