"""A rerun pays for the row that changed: the first and the second `ditgate run`, side by side in one run.

Runs `ditgate run MODEL --rows ROWS` twice as the user would (a fresh command each, timed from the outside) on an
empty result store of its own (OUT/store): the first computes every row and stores the reference rows, the second
reuses them (ditgate.run.reuse) and computes only the rows that are not references. It then checks that both gave
the same verdicts and recorded numbers except timings (outputs and latents bit for bit), and prints the store's
size on disk.

    python benchmarks/rerun.py zoo:flux --rows cp-ulysses-2 --server              # CPU (target: second <= 0.5x first)
    python benchmarks/rerun.py /tmp/fluxdev --build --rows cache --dtype bf16 --device cuda --warmup 1

Targets (issue "a rerun pays for the row that changed"): on CPU the second run at most 0.5x the first; on a GPU
the first at most 1.2x its generations plus the load. The table goes to stdout, everything to OUT/rerun.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_once import differences, run_once  # noqa: E402  (the same command and the same comparison)


def store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def summary(result: dict, rows: list[str]) -> dict:
    """The run's wall, its generations, the load it paid and the chosen rows' own generations."""
    report = result["report"]
    own = {r["name"]: r["generate_s"] for r in report["rows"] if r["name"] in rows}
    return {"wall_s": result["command_wall_s"], "generate_s": result["generate_s"],
            "load_s": (report.get("time") or {}).get("load_s"), "rows_generate_s": own,
            "reused": report.get("reused", {}), "passed": report["passed"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="zoo:NAME or a pipeline folder")
    parser.add_argument("--rows", required=True, help="the rows an integrator reruns (e.g. cp-ulysses-2, cache)")
    parser.add_argument("--out", type=Path, default=Path("runs/rerun"))
    parser.add_argument("--server", action="store_true", help="then the same pair again, from an empty store, on a "
                        "`ditgate serve` started here (imports done; on CPU the pipeline kept)")
    parser.add_argument("--build", action="store_true", help="write the FLUX.1-dev-config folder MODEL first "
                        "when it is missing (benchmarks/flux_dev_random.py)")
    args, extra = parser.parse_known_args()
    if args.build:
        from flux_dev_random import build_if_missing  # beside this script

        build_if_missing(args.model, extra)
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "store"
    shutil.rmtree(store, ignore_errors=True)  # the first run starts from nothing
    os.environ.update(DITGATE_STORE=str(store.resolve()), DITGATE_REUSE="on")
    stamp = time.strftime("%H%M%S")
    runs, load = {}, [os.getloadavg()[0]]
    for name in ("first", "second"):
        folder = args.out / f"{name}-{stamp}"
        runs[name] = (folder, run_once(args.model, "once", folder, ["--rows", args.rows, *extra, "--server", "off"]))
        load.append(os.getloadavg()[0])
    if args.server:  # the pair again on a warm `ditgate serve` started (and stopped) here
        server = subprocess.Popen([sys.executable, "-m", "ditgate", "serve", "--idle", "900"], stderr=subprocess.PIPE,
                                  text=True)
        try:
            while "listening" not in server.stderr.readline():
                if server.poll() is not None:
                    raise SystemExit("ditgate serve did not start")
            shutil.rmtree(store, ignore_errors=True)  # the pair again, from an empty store, on the server
            for name in ("server-first", "server"):
                folder = args.out / f"{name}-{stamp}"
                runs[name] = (folder, run_once(args.model, "once", folder, ["--rows", args.rows, *extra]))
        finally:
            subprocess.run([sys.executable, "-m", "ditgate", "serve", "--stop"], check=False)
            server.wait(timeout=60)
    (a, first), (b, second) = runs["first"], runs["second"]
    diff = differences(first["report"], second["report"], a, b)
    for name in ("server-first", "server"):  # the server's runs: the same verdicts and numbers as the first
        if name in runs:
            diff += [f"{name}: {d}" for d in differences(first["report"], runs[name][1]["report"], a, runs[name][0])]
    chosen = [r for r in args.rows.split(",") if r]
    s1, s2 = summary(first, chosen), summary(second, chosen)
    size = store_bytes(store)
    print("| run | wall (s) | generations (s) | load (s) | the rows' own generation (s) | reused |")
    print("|---|---|---|---|---|---|")
    shown = [("first", s1), ("second, no server", s2)]
    if "server" in runs:
        shown.append(("first, with the server (empty store)", summary(runs["server-first"][1], chosen)))
        shown.append(("second, with the server", summary(runs["server"][1], chosen)))
    for name, s in shown:
        rows = ", ".join(f"{k} {v:.2f}" for k, v in s["rows_generate_s"].items() if v is not None)
        print(f"| {name} | {s['wall_s']:.1f} | {s['generate_s']:.1f} | {s['load_s'] or 0:.1f} | {rows} | "
              f"{', '.join(s['reused']) or '-'} |")
    print(f"\nsecond / first (no server): {s2['wall_s'] / s1['wall_s']:.2f} (target <= 0.5)")
    if "server" in runs:
        s3 = shown[-1][1]
        own = sum(v or 0.0 for v in s3["rows_generate_s"].values())  # that run's own generation of the rows
        print(f"second with server / first: {s3['wall_s'] / s1['wall_s']:.2f}; / its rows' own generation: "
              f"{s3['wall_s'] / own:.2f} (CPU target <= 2)" if own else "")
        if s3["generate_s"]:
            print(f"second with server / every generation it performed (rows and their checks): "
                  f"{s3['wall_s'] / s3['generate_s']:.2f} (GPU target <= 2)")
    for name, s in (("first", s1), *((("first with the server", shown[2][1]),) if "server" in runs else ())):
        print(f"{name} / (its generations + load): {s['wall_s'] / (s['generate_s'] + (s['load_s'] or 0)):.2f} "
              "(GPU target: <= 1.2)")
    print(f"store on disk: {size / 2**20:.2f} MiB in {store}")
    print(f"1-minute load average {', '.join(f'{x:.1f}' for x in load)} (machine of {os.cpu_count()} CPUs)")
    print("identical verdicts and numbers except timings: " + ("yes" if not diff else "NO\n" + "\n".join(diff)))
    (args.out / "rerun.json").write_text(json.dumps(
        {"model": args.model, "rows": args.rows, "extra": extra, "first": s1, "second": s2, "store_bytes": size,
         "server": shown[-1][1] if "server" in runs else None, "load_average": load, "cpus": os.cpu_count(), "differences": diff,
         "runs": {k: {x: y for x, y in r.items() if x != "report"} for k, (_, r) in runs.items()}},
        indent=2, default=str))
    return 0 if not diff else 1


if __name__ == "__main__":
    sys.exit(main())
