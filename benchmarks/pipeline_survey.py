"""Real diffusers pipelines through ditgate: one or more tiny pipelines per model family cache-dit registers.

    python benchmarks/pipeline_survey.py [--only NAME,...] [--skip-parallel] [--twin] [--scaffold | --scaffold-only]
                                         [--jobs N] [--timeout S] [--out FILE] [--work DIR]

The families are the prefixes of cache-dit's `BlockAdapterRegister`, read when the survey runs (a newer cache-dit
extends the list). Each zoo model (`ditgate.zoo`, `ditgate.zoo.pipelines`) whose pipeline class falls under a
family the way cache-dit matches it (the first registered prefix the class name starts with) is, each step a
`ditgate` command in its own process with a time limit:

1. built: `ditgate zoo build zoo:NAME DIR` (save_pretrained);
2. inspect: `ditgate inspect DIR --json`, which also says whether cache-dit has CP and TP planners for it;
3. `ditgate run DIR --rows cache[,cp-ulysses-2][,tp-2]`: the CP and TP rows only where cache-dit has a planner
   (they run on CPU over gloo), left out with `--skip-parallel`. Pipelines that need an input image get
   `--image FILE` (a seeded gradient written here) where `ditgate run` has the option;
4. with `--twin`: `ditgate twin DIR TWIN` (the twin built from the tiny copy's folder) and the same rows on the twin,
   `ditgate run TWIN --rows ...`. The `twin` column says whether every row's verdict on the twin equals its verdict
   on the tiny copy (`agree`) or not (`DIFFER`, the rows and the twin's reasons under reason);
5. with `--scaffold`: `ditgate scaffold DIR` (a plugin written from the observed call, cache-dit's own adapter and
   planners unused, its cache, cp-ulysses-2 and tp-2 rows run on the folder's float32 twin), judged by
   benchmarks/survey_scaffold.py into a table of its own; `--scaffold-only` runs just the build and this step and
   keeps the other columns from the records of the last survey.

`--jobs N` surveys N pipelines at once, each worker single-threaded (OMP_NUM_THREADS=1), the slowest of the last
survey first; the Markdown and JSON are rewritten as each pipeline ends, so a survey cut short keeps what it did.

Writes benchmarks/results/pipeline_survey.md (pipeline | family | built | inspect | cache | cp-ulysses-2 | tp-2 |
twin | reason), keeping the hand-written classification below its marker line, and prints the table and the wall time.
Families with no tiny pipeline here are listed with the diffusers classes they cover.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import threading
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import survey_scaffold  # noqa: E402 - the scaffold column, beside this file
import survey_steps  # noqa: E402 - one ditgate command in a worker and what it printed
RESULTS = ROOT / "benchmarks" / "results" / "pipeline_survey.md"  # and .json beside it, one record per pipeline
MARKER = "<!-- classification: written by hand, kept when the survey rewrites the table above -->"
PARALLEL_ROWS = {"cp-ulysses-2": "cp_planners", "tp-2": "tp_planners"}


@dataclass
class Entry:
    name: str  # zoo name, e.g. "pipe/flux-kontext"
    pipeline: str
    family: str
    image: bool
    cells: dict[str, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    scaffold: dict = field(default_factory=dict)  # the scaffold column (survey_scaffold.judge), when it ran


def families() -> list[str]:
    from cache_dit.caching.block_adapters import BlockAdapterRegister

    return list(BlockAdapterRegister.supported_pipelines()[1])


def family_of(cls_name: str, prefixes: list[str]) -> str | None:
    """The family cache-dit's lookup picks for `cls_name`: the first registered prefix it starts with."""
    return next((p for p in prefixes if cls_name.startswith(p)), None)


def entries(prefixes: list[str]) -> list[Entry]:
    from ditgate import zoo
    from ditgate.zoo import pipelines

    found = []
    for model in list(zoo.ZOO.values()) + list(zoo.PIPELINES.values()):
        family = family_of(model.pipeline, prefixes)
        if family:
            spec = pipelines.PIPELINES.get(model.name.removeprefix(pipelines.PREFIX))
            found.append(Entry(model.name, model.pipeline, family, bool(spec and spec.image)))
    order = {p: i for i, p in enumerate(prefixes)}
    return sorted(found, key=lambda e: (order[e.family], e.name))


def uncovered(prefixes: list[str], covered: set[str]) -> dict[str, list[str]]:
    import diffusers

    classes = [n for n in dir(diffusers) if n.endswith("Pipeline")]
    return {p: sorted(c for c in classes if family_of(c, prefixes) == p) for p in prefixes if p not in covered}


def worker(job: dict) -> None:
    """One pipeline's build, inspect and run, in one process (the imports are paid once); each step's result is
    written to job["result"] as soon as it ends, so a pipeline killed at its time limit keeps the steps it did."""
    results: dict = {"scaffold_only": job.get("scaffold_only", False), "scaffold_asked": bool(job.get("scaffold"))}

    def record(step: str, rc: int, out: str, started: float) -> None:
        results[step] = {"rc": rc, "out": out[-400000:],  # all of an inspect report, the end of a long log
                         "s": round(time.monotonic() - started, 1)}
        Path(job["result"]).write_text(json.dumps(results))

    def timed(step: str, argv: list[str]) -> None:
        started = time.monotonic()
        record(step, *survey_steps.step(argv), started)

    folder, image = job["folder"], job["image"]
    results["skip_parallel"] = job["skip_parallel"]
    timed("build", ["zoo", "build", f"zoo:{job['name']}", folder, "--overwrite"])
    if results["build"]["rc"] != 0:
        return
    if job.get("scaffold_only"):
        timed("scaffold", survey_scaffold.command(folder, *job["scaffold"]))
        return
    started = time.monotonic()
    rc, out = survey_steps.step(["inspect", folder, "--json", *image["inspect"]])
    record("inspect", rc, out, started)
    planners = {}
    if rc == 0:
        cache_dit = survey_steps.inspect_json(out).get("cache_dit") or {}
        planners = {k: any((cache_dit.get(k) or {}).values()) for k in PARALLEL_ROWS.values()}
    rows = ["cache"] + [row for row, key in PARALLEL_ROWS.items()
                        if not job["skip_parallel"] and (rc != 0 or planners.get(key))]
    results["rows"] = rows
    timed("run", ["run", folder, "--rows", ",".join(rows), "--out", job["run_dir"], *image["run"]])
    if job.get("twin"):  # the twin of the tiny copy, built from its folder, and the same rows on it
        timed("twin", ["twin", folder, folder + ".twin", "--overwrite", *image["twin"]])
        if results["twin"]["rc"] == 0:
            timed("twin_run", ["run", folder + ".twin", "--rows", ",".join(rows), "--out", folder + ".twin.run",
                               *image["run"]])
    if job.get("scaffold"):  # a plugin written from the observed call, its rows on the folder's twin
        timed("scaffold", survey_scaffold.command(folder, *job["scaffold"]))


RUNNING: set = set()  # the workers running now (each the leader of its own process group)
STOPPING = threading.Event()  # set on SIGTERM/SIGINT: no new worker starts, the running ones are ended


def stop(signum, frame) -> None:
    """End every running worker with what it started; the survey then writes what it has and exits."""
    STOPPING.set()
    for proc in list(RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def steps_file(folder: Path, scaffold_only: bool = False) -> Path:
    """The worker's record of its steps (a `--scaffold-only` survey keeps its own beside the full survey's)."""
    return folder.with_name(folder.name + (".scaffold.steps.json" if scaffold_only else ".steps.json"))


def survey_one(entry: Entry, work: Path, args, env: dict[str, str], image_options: dict[str, bool]) -> bool:
    start = time.monotonic()
    folder = work / entry.name.replace("/", "+")
    run_dir = folder.with_name(folder.name + ".run")
    result = steps_file(folder, args.scaffold_only)
    result.unlink(missing_ok=True)
    if not args.scaffold_only:  # ditgate run refuses a folder holding an earlier run
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(f"{folder}.twin.run", ignore_errors=True)
    plugin, scaffold_run = survey_scaffold.paths(folder)
    plugin.unlink(missing_ok=True)
    shutil.rmtree(scaffold_run, ignore_errors=True)
    image = ["--image", str(work / "input.png")] if entry.image else []
    job = {"name": entry.name, "folder": str(folder), "run_dir": str(run_dir), "result": str(result),
           "skip_parallel": args.skip_parallel, "twin": args.twin and not args.scaffold_only,
           "scaffold": [str(plugin), str(scaffold_run)] if args.scaffold or args.scaffold_only else None,
           "scaffold_only": args.scaffold_only,
           "image": {k: image if v else [] for k, v in image_options.items()}}
    if STOPPING.is_set():
        return False
    # its own session, so that a pipeline past its time limit is ended with every process it started (torchrun)
    proc = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(job)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    RUNNING.add(proc)
    try:
        proc.wait(timeout=args.timeout)
        late = "stopped (the survey was stopped)" if STOPPING.is_set() else None
    except subprocess.TimeoutExpired:
        late = f"timed out after {args.timeout:.0f} s"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    RUNNING.discard(proc)
    steps = json.loads(result.read_text()) if result.is_file() else {}
    steps["seconds"] = time.monotonic() - start
    if late:
        steps["late"] = late
    result.write_text(json.dumps(steps))
    judge(entry, work, steps, args.skip_parallel)
    return True


def judge(entry: Entry, work: Path, steps: dict, skip_parallel: bool) -> None:
    """The table cells and reasons of one pipeline, from its worker's steps and its run's report.json; then the
    scaffold column's, when the worker ran that step."""
    folder = work / entry.name.replace("/", "+")
    if not steps.get("scaffold_only"):
        _judge_columns(entry, folder, steps, skip_parallel)
    if steps.get("scaffold_asked"):
        survey_scaffold.judge(entry, folder, steps)


def _judge_columns(entry: Entry, folder: Path, steps: dict, skip_parallel: bool) -> None:
    run_dir = folder.with_name(folder.name + ".run")
    late = steps.get("late")
    entry.seconds = steps.get("seconds", 0.0)
    for step, column in (("build", "built"), ("inspect", "inspect")):
        got = steps.get(step)
        if got is None:
            entry.reasons.append(f"{step}: {late or 'the worker ended before this step'}")
            return
        entry.cells[column] = ("yes" if column == "built" else "pass") if got["rc"] == 0 else \
            ("no" if column == "built" else "FAIL")
        if got["rc"] != 0:
            entry.reasons.append(f"{step}: {survey_steps.last_error(got['out'])}{survey_steps.where(got['out'])}")
            if step == "build":
                return
    rows = steps.get("rows", ["cache"])
    for row in PARALLEL_ROWS:
        if row not in rows:
            entry.cells[row] = "skipped" if steps.get("skip_parallel", skip_parallel) else "no planner"
    out = steps.get("run", {}).get("out", late or "the worker ended before the run")
    report_path = run_dir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    by_name = {r["name"]: r for r in (report or {}).get("rows", [])}
    base = by_name.get("baseline")
    base_failed = base is not None and base.get("status") not in ("passed", "reference")
    if base_failed:  # every row then says only that its baseline failed
        entry.reasons.append(f"baseline: {survey_steps.row_reason(base)}")
    for row in rows:
        got = by_name.get(row)
        if got is None:
            entry.cells[row] = "FAIL"
            entry.reasons.append(f"{row}: {survey_steps.last_error(out)}{survey_steps.where(out)}" if report is None
                                 else f"{row}: not in the report")
            if report is None:
                break
            continue
        entry.cells[row] = cell(got)
        if entry.cells[row] != "pass" and not base_failed:
            entry.reasons.append(f"{row}: {survey_steps.row_reason(got)}")
    for row in rows:
        entry.cells.setdefault(row, "FAIL")
    if "twin" in steps:
        twin_cell(entry, steps, rows, Path(f"{folder}.twin.run") / "report.json", by_name)


def cell(row: dict | None) -> str:
    """A row's cell: pass, FAIL, or inconclusive where its gate could not judge (its reason says why): neither a
    pass nor a failure, and left out of the totals' tried count."""
    status = (row or {}).get("status")
    return "pass" if status == "passed" else "inconclusive" if status == "inconclusive" else "FAIL"


def twin_cell(entry: Entry, steps: dict, rows: list[str], report_path: Path, tiny: dict | None = None) -> None:
    """`agree` when every row's verdict on the twin equals the tiny copy's, else `DIFFER` and why. A cache row is
    compared as twin rows judge it (`ditgate.run.twinned.verdict`: its proofs and its caching-off check): its
    approximation gate depends on the weights and the steps, so a tiny copy and a twin may differ there with the
    same structure (mochi's latent rule: 0.091 against 0.05 on the tiny copy, a pass on the twin); such a
    difference is named, not counted."""
    from ditgate.run.twinned import verdict as structural

    if steps["twin"]["rc"] != 0 or not report_path.is_file():
        step = "twin" if steps["twin"]["rc"] != 0 else "twin_run"
        out = steps.get(step, {}).get("out", steps.get("late", "the worker ended before this step"))
        entry.cells["twin"] = "no twin" if step == "twin" else "DIFFER"
        entry.reasons.append(f"{step}: {survey_steps.last_error(out)}{survey_steps.where(out)}")
        return
    twin_rows = {r["name"]: r for r in json.loads(report_path.read_text()).get("rows", [])}
    differ = []
    for row in rows:
        got = twin_rows.get(row)
        verdict = cell(got)
        mine = (tiny or {}).get(row)
        if got and mine and got.get("phase") == "cache" and got.get("status") != "error" \
                and mine.get("status") != "error":
            ours, theirs = structural(mine)["status"], structural(got)["status"]
            if ours == theirs:
                if verdict != entry.cells.get(row):
                    entry.reasons.append(f"twin: {row}'s structure agrees ({ours}); its approximation gate "
                                         f"{entry.cells.get(row)} on the tiny copy, {verdict} on the twin (weights)")
                continue
            why = "; ".join(structural(got)["reasons"])
            differ.append(f"twin: {row} structure {ours} on the tiny copy, {theirs} on the twin"
                          + (f" ({why[:300]})" if why else ""))
            continue
        if verdict != entry.cells.get(row):
            why = survey_steps.row_reason(got) if got else "not in the twin's report"
            differ.append(f"twin: {row} {entry.cells.get(row)} on the tiny copy, {verdict} on the twin"
                          + (f" ({why})" if verdict == "FAIL" else ""))
    entry.cells["twin"] = "DIFFER" if differ else "agree"
    entry.reasons += differ


COLUMNS = ("built", "inspect", "cache", "cp-ulysses-2", "tp-2", "twin")


def markdown(done: list[Entry], missing: dict[str, list[str]], runs: list[dict]) -> str:
    import cache_dit
    import diffusers
    import torch

    lines = [f"# Pipeline survey: diffusers {diffusers.__version__}, cache-dit {cache_dit.__version__}, "
             f"torch {torch.__version__}", "",
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; the runs that made this table:", "",
             *[f"- `{r['command']}`: {r['pipelines']} pipelines, "
               + (f"{r['wall_s'] / 60:.1f} min of the pipelines' own time (the runs that wrote the folder: below)"
                  if "--collect" in r["command"] else f"{r['wall_s'] / 60:.1f} min wall") for r in runs], "",
             "| pipeline | family | class | built | inspect | cache | cp-ulysses-2 | tp-2 | twin | s | reason |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in done:
        cells = " | ".join(e.cells.get(c, "–") for c in COLUMNS)
        reason = "; ".join(e.reasons).replace("|", "/") or ""
        seconds = f"{e.seconds:.0f}" if e.seconds else "–"  # unknown for steps a collected survey did not time
        lines.append(f"| zoo:{e.name} | {e.family} | {e.pipeline} | {cells} | {seconds} | {reason} |")
    lines += ["", "Totals:", ""]
    for c in COLUMNS:
        ok = sum(e.cells.get(c) in ("yes", "pass", "agree") for e in done)
        tried = sum(e.cells.get(c) in ("yes", "no", "pass", "FAIL", "agree", "DIFFER", "no twin") for e in done)
        unjudged = sum(e.cells.get(c) == "inconclusive" for e in done)
        lines.append(f"- {c}: {ok} of {tried} tried" + (f" ({unjudged} more inconclusive)" if unjudged else ""))
    lines.append(f"- families covered: {len({e.family for e in done})}")
    lines += survey_scaffold.markdown(done)
    if missing:
        lines += ["", "Families with no tiny pipeline here (the diffusers classes under each prefix):", ""]
        lines += [f"- {fam}: {', '.join(classes) or 'diffusers ' + diffusers.__version__ + ' ships none'}"
                  for fam, classes in missing.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated zoo names (pipe/flux-kontext or flux-kontext, flux)")
    parser.add_argument("--skip-parallel", action="store_true", help="run only the cache row")
    parser.add_argument("--twin", action="store_true",
                        help="also build each tiny copy's twin and run the same rows on it (the twin column)")
    parser.add_argument("--scaffold", action="store_true",
                        help="also run `ditgate scaffold` on each pipeline (the scaffold column)")
    parser.add_argument("--scaffold-only", action="store_true",
                        help="build and scaffold only, keeping the other columns from the last survey's records")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="pipelines surveyed at once, each single-threaded (default 1)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds for one pipeline: build, inspect and rows (default 900)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"Markdown file (default {RESULTS})")
    parser.add_argument("--work", type=Path, help="folder for the models and runs (default: a temporary one)")
    parser.add_argument("--collect", action="store_true",
                        help="write the results of what a survey into --work has finished so far (runs nothing)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one pipeline's steps, as a job in JSON
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    start = time.monotonic()
    prefixes = families()
    todo = entries(prefixes)
    if args.only:
        wanted = {n.strip().removeprefix("zoo:") for n in args.only.split(",")}
        todo = [e for e in todo if e.name in wanted or e.name.removeprefix("pipe/") in wanted]
    if args.collect and not args.work:
        parser.error("--collect needs --work")
    work = args.work or Path(tempfile.mkdtemp(prefix="pipeline_survey."))
    work.mkdir(parents=True, exist_ok=True)
    # --only and --scaffold-only update their pipelines in the records of the last survey; a full one replaces them
    records = args.out.with_suffix(".json")
    old = json.loads(records.read_text()) if (args.only or args.collect or args.scaffold_only) and records.is_file() \
        else {"entries": [], "runs": []}
    before = {e["name"]: Entry(**e) for e in old["entries"]}
    if args.scaffold_only:  # the other columns as the last survey left them
        todo = [before.get(e.name, e) for e in todo]
        for e in todo:
            e.scaffold = {}
    if not args.collect:
        survey_steps.test_image(work / "input.png")
    env = dict(os.environ, DITGATE_HOME=str(work / "home"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    if args.jobs > 1:  # N pipelines at once: each worker and the ranks it starts on one thread
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    image_options = {cmd: survey_steps.has_option(cmd, "--image") for cmd in ("run", "inspect")}
    image_options["twin"] = False  # the twin's call uses its own seeded test image
    command = "python benchmarks/pipeline_survey.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    finished: list[Entry] = []
    lock = threading.Lock()

    def write(wall: float) -> str:
        merged = dict(before)
        merged.update({e.name: e for e in finished})
        order = [e.name for e in entries(prefixes)]
        done = sorted(merged.values(), key=lambda e: order.index(e.name) if e.name in order else len(order))
        runs = [r for r in old["runs"] if not (args.collect and r.get("work") == str(work))] + [
            {"command": command, "pipelines": len(finished), "wall_s": round(wall, 1),
             "skip_parallel": args.skip_parallel, "work": str(work)}]
        records.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(records, json.dumps({"entries": [asdict(e) for e in done], "runs": runs}, indent=1) + "\n")
        text = markdown(done, uncovered(prefixes, {e.family for e in entries(prefixes)}), runs)
        kept = args.out.read_text().split(MARKER, 1)[1] if args.out.is_file() and MARKER in args.out.read_text() \
            else "\n"
        write_atomic(args.out, text + "\n" + MARKER + kept)
        return text

    if args.collect:  # the steps a survey into --work has finished so far, nothing run
        for entry in todo:
            folder = work / entry.name.replace("/", "+")
            if steps_file(folder).is_file():
                judge(entry, work, json.loads(steps_file(folder).read_text()), args.skip_parallel)
            if steps_file(folder, True).is_file():  # a later --scaffold-only survey's column
                judge(entry, work, json.loads(steps_file(folder, True).read_text()), args.skip_parallel)
            if steps_file(folder).is_file() or steps_file(folder, True).is_file():
                finished.append(entry)
        print(write(sum(e.seconds for e in finished)))  # the pipelines' own time; the runs that wrote --work unknown
        return 0

    def last_time(e: Entry) -> float:
        was = before.get(e.name)
        return ((was.seconds or 0) + ((was.scaffold or {}).get("seconds") or 0)) if was else 0.0

    todo.sort(key=last_time, reverse=True)  # the slowest first, so that the last to end is a short one

    def one(entry: Entry) -> None:
        if not survey_one(entry, work, args, env, image_options):
            return  # the survey was stopped before this pipeline started
        if not (args.scaffold or args.scaffold_only) and entry.name in before:
            entry.scaffold = before[entry.name].scaffold  # a survey without the column keeps the last one's
        with lock:
            finished.append(entry)
            write(time.monotonic() - start)
            scaffold = entry.scaffold or {}
            print(f"[{len(finished)}/{len(todo)} {time.monotonic() - start:.0f}s] {entry.name:<24} "
                  + " ".join(f"{c}={entry.cells.get(c, '-')}" for c in COLUMNS)
                  + (" scaffold=" + ",".join(scaffold.get("cells", {}).get(r, "-") for r in survey_scaffold.ROWS)
                     if scaffold else "")
                  + f"  {entry.seconds:.0f}s  {'; '.join(entry.reasons + scaffold.get('reasons', []))[:300]}",
                  flush=True)

    from concurrent.futures import ThreadPoolExecutor

    signal.signal(signal.SIGTERM, stop)  # `timeout` ends the survey: its workers end too, its results are written
    signal.signal(signal.SIGINT, stop)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo))
    with lock:
        print(write(time.monotonic() - start))
    return 0


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it (a survey killed mid-write leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
