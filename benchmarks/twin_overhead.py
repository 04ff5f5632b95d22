"""What the twin rows add to a reduced-precision run, side by side in one run: `--twin off` against `--twin auto`.

Runs `ditgate run MODEL --rows ROWS --twin off` and `--twin auto` as a user would (a fresh command each, timed from
the outside, alternating when `--pairs` > 1), then prints each run's wall, the twin's own time (report.json
`time.twin_s`: build or cache lookup, and the twin's rows), the ratio, and every row's verdict with the twin's
beside it. The model's own verdicts must be the same in both runs (the twin only adds its own).

    python benchmarks/twin_overhead.py zoo:flux --dtype bf16 --rows cache,tp-2            # CPU
    python benchmarks/twin_overhead.py /tmp/fluxdev --device cuda --dtype bf16 --rows cache,tp-2 --build

`--build` writes the FLUX.1-dev-config folder with random weights (benchmarks/flux_dev_random.py) when it is
missing. The table goes to stdout, everything to OUT/twin_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODES = ("off", "auto")


def run_once(model: str, mode: str, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "ditgate", "run", model, "--twin", mode, "--out", str(out), "--json", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    rows = {}
    for row in report.get("rows", []):
        twin = row.get("twin") or {}
        rows[row["name"]] = {"status": row.get("status"), "twin": twin.get("status")}
    timing = report.get("time", {})
    return {"mode": mode, "wall_s": round(wall, 2), "exit": proc.returncode, "twin_s": timing.get("twin_s"),
            "rows": rows, "twin": report.get("twin"), "stderr_tail": proc.stderr[-3000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rows", default="cache,tp-2")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--out", default="/tmp/twin_overhead")
    parser.add_argument("--build", action="store_true", help="build the FLUX.1-dev-config folder when missing")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.build:
        from flux_dev_random import build_if_missing  # beside this script

        build_if_missing(args.model, extra, args.device)
    common = ["--rows", args.rows, "--dtype", args.dtype, "--device", args.device, *extra]
    runs = []
    for pair in range(args.pairs):
        order = MODES if pair % 2 == 0 else MODES[::-1]
        for mode in order:
            result = run_once(args.model, mode, out / f"{mode}-{pair}", common)
            print(f"{mode:>4} pair {pair}: {result['wall_s']:.1f} s, exit {result['exit']}, "
                  f"twin {result['twin_s']} s", flush=True)
            runs.append(result)
    walls = {mode: [r["wall_s"] for r in runs if r["mode"] == mode] for mode in MODES}
    best = {mode: min(values) for mode, values in walls.items()}
    added = best["auto"] / best["off"] - 1.0
    same = all(r["rows"].get(name, {}).get("status") == first["status"]
               for r in runs for name, first in runs[0]["rows"].items())
    print(f"\n| run | wall s (best of {args.pairs}) | twin s |\n|---|---|---|")
    for mode in MODES:
        twin_s = [r["twin_s"] for r in runs if r["mode"] == mode and r["twin_s"] is not None]
        print(f"| --twin {mode} | {best[mode]:.1f} | {min(twin_s) if twin_s else '-'} |")
    print(f"\nwall added by the twin rows: {added:+.1%} (goal ≤ +25 %); model verdicts equal in both: {same}")
    last = [r for r in runs if r["mode"] == "auto"][-1]
    for name, verdicts in last["rows"].items():
        print(f"  {name}: model {verdicts['status']}, twin {verdicts['twin']}")
    (out / "twin_overhead.json").write_text(json.dumps(
        {"model": args.model, "rows": args.rows, "dtype": args.dtype, "device": args.device, "runs": runs,
         "best_wall_s": best, "added": added, "verdicts_equal": same}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
