"""The twins of the real flagship configurations: build time, size and peak memory, and their exact rows on the CPU.

    nice python benchmarks/twin_build.py [--only flux1-dev,wan2.1-t2v-14b] [--rows cache,cp-ulysses-2,tp-2]
                                         [--work DIR] [--timeout S]

For each config folder in src/ditgate/twin/configs (configs and tokenizer configs only, no weights), one after the
other, each step a `ditgate` command in its own process as a user would type it:

1. `ditgate twin FOLDER WORK/NAME --json`: wall, the twin's parameters and size on disk, the peak resident set of
   the process (`wait4`'s ru_maxrss: the largest process of the tree);
2. `ditgate run WORK/NAME --rows ROWS --dtype float32 --device cpu --json`: the rows cache-dit can run on the twin
   (`cache` always; `cp-ulysses-2` / `tp-2` where cache-dit registers a CP / TP planner for the twin's transformer
   classes, by cache-dit's own prefix rule), each row's verdict, the run's wall and peak resident set.

Writes benchmarks/results/twin_build.json (one record per folder; `--only` updates its folders in the last records)
and twin_build.md (the table), and prints each folder's line as it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CONFIGS = ROOT / "src" / "ditgate" / "twin" / "configs"
RESULTS = ROOT / "benchmarks" / "results" / "twin_build.json"  # and .md beside it
PARALLEL_ROWS = ("cp-ulysses-2", "tp-2")
GOAL = {"flux1-dev": {"build_s": 60.0, "bytes": 4e9}}  # the goal for a FLUX.1-dev-sized model


def folders() -> list[str]:
    return sorted(p.name for p in CONFIGS.iterdir() if (p / "model_index.json").is_file()
                  or (p / "modular_model_index.json").is_file())


def timed(argv: list[str], log: Path, timeout: float, env: dict[str, str]) -> dict:
    """`python -m ditgate ARGV` in a process of its own: exit status, wall, peak RSS (GiB), stdout; stderr to LOG."""
    start = time.perf_counter()
    with open(log, "w") as err, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ditgate", *argv], stdout=out, stderr=err, env=env,
                                cwd=ROOT, start_new_session=True)
        late = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                os.killpg(proc.pid, 9)  # the command and its ranks, nothing else
                pid, status, usage = os.wait4(proc.pid, 0)
                late = True
                break
            time.sleep(0.5)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read()
    return {"rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 1), "late": late,
            "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2), "stdout": stdout}


def last_json(text: str) -> dict:
    """The last line-initial JSON object a command printed (progress can come before it)."""
    decoder = json.JSONDecoder()
    starts = [i for i, ch in enumerate(text) if ch == "{" and (i == 0 or text[i - 1] == "\n")]
    for start in reversed(starts):
        try:
            found, _ = decoder.raw_decode(text, start)
            return found
        except ValueError:
            continue
    return {}


def planned_rows(twin: Path, wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The rows of `wanted` cache-dit can run on the twin: the parallel ones only where a planner is registered
    for every transformer class of the twin (cache-dit looks planners up by class-name prefix)."""
    from cache_dit.distributed.transformers.register import (ContextParallelismPlannerRegister,
                                                             TensorParallelismPlannerRegister)

    from ditgate.inspect.plan.support import activate_registries

    activate_registries()
    index = json.loads((twin / "model_index.json").read_text())
    classes = [spec[1] for name, spec in index.items() if name.startswith("transformer") and isinstance(spec, list)]
    registers = {"cp-ulysses-2": ContextParallelismPlannerRegister, "tp-2": TensorParallelismPlannerRegister}
    rows, left = [], {}
    for row in wanted:
        register = registers.get(row)
        if register is not None:
            prefixes = register.supported_planners()[1]
            missing = [c for c in classes if not any(c.startswith(p) for p in prefixes)]
            if missing:
                left[row] = f"cache-dit registers no {row.split('-')[0].upper()} planner for {', '.join(missing)}"
                continue
        rows.append(row)
    return rows, left


def one(name: str, work: Path, args, env: dict[str, str]) -> dict:
    twin, run_dir = work / name, work / f"{name}.run"
    shutil.rmtree(run_dir, ignore_errors=True)
    record: dict = {"model": name, "source": f"src/ditgate/twin/configs/{name}"}
    built = timed(["twin", str(CONFIGS / name), str(twin), "--json", "--overwrite"], work / f"{name}.twin.log",
                  args.timeout, env)
    made = last_json(built.pop("stdout"))
    record["build"] = built | {"params": made.get("params"), "bytes": made.get("bytes"),
                               "build_s_reported": made.get("build_s"), "call": made.get("call"),
                               "components": [{k: c.get(k) for k in ("name", "class", "action", "params")}
                                              for c in made.get("components", [])]}
    if built["rc"] != 0:
        record["build"]["error"] = (work / f"{name}.twin.log").read_text().strip().splitlines()[-1:] or ["no output"]
        return record
    rows, left = planned_rows(twin, args.rows.split(","))
    record["rows_left_out"] = left
    ran = timed(["run", str(twin), "--rows", ",".join(rows), "--dtype", "float32", "--device", "cpu",
                 "--out", str(run_dir), "--json"], work / f"{name}.run.log", args.timeout, env)
    ran.pop("stdout")
    report_path = run_dir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    verdicts = {}
    for row in report.get("rows", []):
        if row["name"] in rows:
            reason = "" if row.get("status") == "passed" else str((row.get("reasons") or [""])[0])[:300]
            verdicts[row["name"]] = {"status": row.get("status"), "reason": reason}
    if not report:
        tail = (work / f"{name}.run.log").read_text().strip().splitlines()[-1:]
        verdicts = {row: {"status": "no report", "reason": (tail or ["no output"])[0][:300]} for row in rows}
    record["run"] = ran | {"rows": verdicts}
    return record


def _gib(n) -> str:
    return f"{n / 2**30:.2f}" if n else "–"


def _params(n) -> str:
    return f"{n / 1e6:.0f} M" if n else "–"


def markdown(records: list[dict], runs: list[dict]) -> str:
    import cache_dit
    import diffusers
    import torch

    lines = [f"# Twins of the real configurations: diffusers {diffusers.__version__}, cache-dit "
             f"{cache_dit.__version__}, torch {torch.__version__}", "",
             "Each twin built from its config folder (no weights) by `ditgate twin`, then its exact rows run on the "
             "CPU in float32 by `ditgate run TWIN --rows ... --dtype float32 --device cpu` (2 ranks over gloo). "
             "Peak RSS: the largest process of the command's tree. The runs that made this table:", "",
             *[f"- `{r['command']}` on {r['machine']}: {r['models']} folders, {r['wall_s'] / 60:.1f} min" for r in runs],
             "", "| model | twin params | size GiB | build s | build peak RSS GiB | rows (verdict) | rows s | "
             "rows peak RSS GiB | notes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        b, run = r.get("build", {}), r.get("run", {})
        notes = []
        if b.get("rc") not in (0, None):
            notes.append(f"build failed: {' '.join(b.get('error', []))}"[:300])
        notes += [r["note"]] if r.get("note") else []  # written by hand into the JSON: what the numbers cannot say
        notes += [f"{row}: {why}" for row, why in r.get("rows_left_out", {}).items()]
        notes += [f"{row}: {v['reason']}" for row, v in run.get("rows", {}).items() if v.get("reason")]
        goal = GOAL.get(r["model"])
        if goal and b.get("rc") == 0:
            size = (b.get("bytes") or 0) / 1e9
            notes.append(f"goal ≤{goal['build_s']:.0f} s: {'met' if b['wall_s'] <= goal['build_s'] else 'MISSED'}; "
                         f"goal ≤{goal['bytes'] / 1e9:.0f} GB: {size:.3f} GB, "
                         f"{'met' if size * 1e9 <= goal['bytes'] else 'over'}")
        if b.get("late") or run.get("late"):
            notes.append("timed out")
        verdicts = ", ".join(f"{row} {'pass' if v['status'] == 'passed' else v['status'].upper()}"
                             for row, v in run.get("rows", {}).items()) or "–"
        lines.append(f"| {r['model']} | {_params(b.get('params'))} | {_gib(b.get('bytes'))} | {b.get('wall_s', '–')} | "
                     f"{b.get('peak_rss_gib', '–')} | {verdicts} | {run.get('wall_s', '–')} | "
                     f"{run.get('peak_rss_gib', '–')} | {'; '.join(notes).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated folder names (default: every folder)")
    parser.add_argument("--rows", default="cache," + ",".join(PARALLEL_ROWS))
    parser.add_argument("--work", type=Path, help="where the twins and runs go (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for one command (default 1800)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true", help="rewrite the .md from the .json (runs nothing)")
    args = parser.parse_args(argv)
    if args.table:
        old = json.loads(args.out.read_text())
        args.out.with_suffix(".md").write_text(markdown(old["records"], old["runs"]))
        return 0
    names = folders()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",")]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"no config folder {', '.join(unknown)} in {CONFIGS}")
        names = [n for n in names if n in wanted]
    work = args.work or Path(tempfile.mkdtemp(prefix="twin_build."))
    work.mkdir(parents=True, exist_ok=True)
    # src first, then the caller's path (wheels installed into a target folder on a machine without the venv)
    path = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYTHONPATH=path, DITGATE_HOME=str(work / "home"))
    old = json.loads(args.out.read_text()) if args.out.is_file() else {"records": [], "runs": []}
    records = {r["model"]: r for r in old["records"]}
    command = "python benchmarks/twin_build.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    cores = f"{len(os.sched_getaffinity(0))} of {os.cpu_count()} CPU cores"  # a run pinned with taskset: its share
    run = {"command": command, "machine": f"{cores} ({platform.machine()})", "models": 0,
           "wall_s": 0.0}
    runs = old["runs"] + [run]
    start = time.monotonic()
    for name in names:
        record = one(name, work, args, env)
        records[name] = record
        run["models"] += 1
        run["wall_s"] = round(time.monotonic() - start, 1)
        ordered = [records[n] for n in folders() if n in records]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"records": ordered, "runs": runs}, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(markdown(ordered, runs))
        b, r = record["build"], record.get("run", {})
        print(f"{name:<24} build rc={b['rc']} {b['wall_s']} s {_params(b.get('params'))} {_gib(b.get('bytes'))} GiB "
              f"rss {b['peak_rss_gib']} GiB | rows {json.dumps({k: v['status'] for k, v in r.get('rows', {}).items()})}"
              f" {r.get('wall_s', '–')} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
