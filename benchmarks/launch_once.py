"""Both launch designs of `ditgate run`, side by side in one run: wall time, generations and overhead per row.

Runs `ditgate run MODEL --launch per-row` and `--launch once` as the user would (a fresh command each, timed from
the outside), alternating when `--pairs` > 1, then checks that both gave the same verdicts and the same recorded
numbers except timings and peak memory (the outputs and latents bit for bit, metrics, facts, proofs).

    python benchmarks/launch_once.py zoo:flux                                    # CPU: the default rows
    python benchmarks/launch_once.py zoo:flux --against /tmp/old/src             # and an older checkout's once
    python benchmarks/launch_once.py zoo:wan --rows cache,cp-ulysses-2,tp-2
    python benchmarks/launch_once.py /tmp/fluxdev --device cuda --dtype bf16 --rows cache --build

`--build` writes the FLUX.1-dev-config folder with random weights (benchmarks/flux_dev_random.py) first when it is
missing. The table goes to stdout, everything to OUT/launch_once.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DESIGNS = ("per-row", "once")
TIMING_KEYS = {"latency_s", "times", "speedup", "prediction", "peak_memory_bytes", "generate_s", "overhead",
               "resumed", "reused_from", "speedup_caveats", "warmup_calls"}  # warm-up: how a row was timed
OVERHEAD = ("launch_s", "load_s", "restore_s", "setup_s")


def run_once(model: str, design: str, out: Path, extra: list[str], src: Path | None = None) -> dict:
    """One `ditgate run` of `design`; `src`: run the ditgate of that source folder (an older checkout's src/)."""
    cmd = [sys.executable, "-m", "ditgate", "run", model, "--launch", design, "--out", str(out), "--json", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])) if src else None
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    rows = [r for r in report["rows"] if r.get("generate_s") is not None]
    generate = report["time"]["generate_s"]  # the check rows' generations too (sensitivity, cache-off twins)
    return {"design": design + (f" ({src})" if src else ""), "command_wall_s": round(wall, 2), "runner_wall_s": report["wall_s"],
            "generate_s": round(generate, 2), "overhead_s": round(wall - generate, 2),
            "overhead_per_row_s": round((wall - generate) / max(len(rows), 1), 2),
            "ratio": round(wall / generate, 2) if generate else None, "time": report.get("time"),
            "rows": {r["name"]: {"generate_s": r["generate_s"], **(r.get("overhead") or {})} for r in rows},
            "report": report}


def differences(a: dict, b: dict, run_a: Path, run_b: Path) -> list[str]:
    """What differs between two reports apart from timings and memory: verdicts, metrics, facts, arrays."""
    found = []
    rows_a, rows_b = ({r["name"]: r for r in rep["rows"]} for rep in (a, b))
    if list(rows_a) != list(rows_b):
        return [f"rows differ: {list(rows_a)} vs {list(rows_b)}"]
    for name, ra in rows_a.items():
        rb = rows_b[name]
        for key in sorted(set(ra) | set(rb)):
            if key in TIMING_KEYS:
                continue
            va, vb = ra.get(key), rb.get(key)
            if key == "error" and va and vb:  # where a failed row failed, not the group folder it failed in
                va, vb = va.get("message"), vb.get("message")
            if key == "facts" and va and vb:  # the time spent in the transformer is a timing too
                va, vb = ({k: v for k, v in f.items() if k != "transformer_time_s"} for f in (va, vb))
            if json.dumps(va, sort_keys=True, default=str) != json.dumps(vb, sort_keys=True, default=str):
                found.append(f"{name}.{key}: {str(va)[:200]} != {str(vb)[:200]}")
        for array in ("output", "latents", "noise"):
            fa, fb = (run / "rows" / name / f"{array}.npy" for run in (run_a, run_b))
            if fa.is_file() != fb.is_file():
                found.append(f"{name}/{array}.npy exists in one run only")
            elif fa.is_file() and not np.array_equal(np.load(fa), np.load(fb), equal_nan=True):
                found.append(f"{name}/{array}.npy differs")
    return found


def table(results: list[dict]) -> str:
    lines = ["| design | wall (s) | generations (s) | overhead (s) | overhead per row (s) | wall / generations |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['design']} | {r['command_wall_s']:.1f} | {r['generate_s']:.1f} | {r['overhead_s']:.1f} | "
                     f"{r['overhead_per_row_s']:.2f} | {r['ratio']:.2f} |")
    lines += ["", "| design | row | generation (s) | launch | load | restore | setup | row overhead / generation |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, t in r["rows"].items():
            parts = [t.get(k, 0.0) for k in OVERHEAD]
            share = sum(parts) / t["generate_s"] if t["generate_s"] else float("nan")
            lines.append(f"| {r['design']} | {name} | {t['generate_s']:.2f} | "
                         + " | ".join(f"{p:.2f}" for p in parts) + f" | {share:.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="zoo:NAME or a pipeline folder")
    parser.add_argument("--out", type=Path, default=Path("runs/launch-once"))
    parser.add_argument("--pairs", type=int, default=1, help="runs of each design, alternating (default 1)")
    parser.add_argument("--against", type=Path, metavar="SRC", help="also time `--launch once` of the ditgate in "
                        "SRC (an older checkout's src/), in the same run: old code vs new")
    parser.add_argument("--build", action="store_true", help="write the FLUX.1-dev-config folder MODEL first "
                        "when it is missing (benchmarks/flux_dev_random.py)")
    args, extra = parser.parse_known_args()
    if args.build:
        from flux_dev_random import build_if_missing  # beside this script

        build_if_missing(args.model, extra)
    args.out.mkdir(parents=True, exist_ok=True)
    results, folders = [], {}
    load = [os.getloadavg()[0]]
    for pair in range(args.pairs):
        for design in (DESIGNS if pair % 2 == 0 else DESIGNS[::-1]):
            folder = args.out / f"{design}-{pair + 1}-{time.strftime('%H%M%S')}"
            result = run_once(args.model, design, folder, extra)
            results.append(result)
            folders.setdefault(design, (folder, result["report"]))
            load.append(os.getloadavg()[0])
        if args.against:
            folder = args.out / f"against-{pair + 1}-{time.strftime('%H%M%S')}"
            results.append(run_once(args.model, "once", folder, extra, src=args.against.resolve()))
            load.append(os.getloadavg()[0])
    (run_a, rep_a), (run_b, rep_b) = folders["per-row"], folders["once"]
    diff = differences(rep_a, rep_b, run_a, run_b)
    print(table(results))
    walls = {d: [r["command_wall_s"] for r in results if r["design"] == d] for d in DESIGNS}
    if args.against:
        old = [r["command_wall_s"] for r in results if r["design"] not in DESIGNS]
        print(f"wall once / once of {args.against}: {np.median(walls['once']) / np.median(old):.2f}")
    print(f"\nwall once / per-row: {np.median(walls['once']) / np.median(walls['per-row']):.2f}; "
          f"1-minute load average {', '.join(f'{x:.1f}' for x in load)} (machine of {os.cpu_count()} CPUs)")
    print("identical verdicts and numbers except timings: " + ("yes" if not diff else "NO\n" + "\n".join(diff)))
    verdicts = {d: rep["passed"] for d, (_, rep) in folders.items()}
    summary = {"model": args.model, "extra": extra, "load_average": load, "cpus": os.cpu_count(),
               "verdicts": verdicts, "differences": diff,
               "runs": [{k: v for k, v in r.items() if k != "report"} for r in results]}
    (args.out / "launch_once.json").write_text(json.dumps(summary, indent=2, default=str))
    return 0 if not diff else 1


if __name__ == "__main__":
    sys.exit(main())
