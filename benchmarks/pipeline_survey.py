"""Real diffusers pipelines through ditgate: one or more tiny pipelines per model family cache-dit registers.

    python benchmarks/pipeline_survey.py [--only NAME,...] [--skip-parallel] [--timeout S] [--out FILE]

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
   on the tiny copy (`agree`) or not (`DIFFER`, the rows and the twin's reasons under reason).

Writes benchmarks/results/pipeline_survey.md (pipeline | family | built | inspect | cache | cp-ulysses-2 | tp-2 |
twin | reason), keeping the hand-written classification below its marker line, and prints the table and the wall time.
Families with no tiny pipeline here are listed with the diffusers classes they cover.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
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


def _last_error(text: str) -> str:
    """The last line of a command's output that reads as an error (a traceback's last line, a ditgate error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^([A-Za-z_.]+(Error|Exception)|error|ditgate: error|AssertionError)\b", line) or "Error:" in line:
            if " with {" in line and "} failed: " in line:  # "running X with {the call} failed: E": X and E
                line = line.split(" with {", 1)[0] + ": " + line.split("} failed: ", 1)[1]
            return line[:300]
    return (lines[-1][:300] if lines else "no output")


def _where(text: str) -> str:
    """file:line of the innermost frame of the last traceback in `text` (site-packages paths shortened)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', text)
    if not frames:
        return ""
    path, line = frames[-1]
    return f" ({re.sub(r'^.*/(site-packages|src)/', '', path)}:{line})"


STDERR_MARK = "\n--- stderr ---\n"


def _has_option(command: str, option: str) -> bool:
    """Whether `ditgate COMMAND` takes `option` (read from the CLI's own parser)."""
    from ditgate.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return option in sub.choices[command]._option_string_actions


def _test_image(path: Path) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64]
    img = np.stack([x * 4, y * 4, 255 - (x + y) * 2], -1).astype(np.float64)
    img[16:40, 20:44] = rng.integers(0, 255, 3)  # a block of one seeded colour
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(path)
    return path


def _step(argv: list[str]) -> tuple[int, str]:
    """`ditgate ARGV` in this process: exit status and what it printed (stderr after stdout)."""
    import contextlib
    import io
    import traceback

    from ditgate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a traceback is a result here
            traceback.print_exc()
            rc = 1
    return rc, out.getvalue() + STDERR_MARK + err.getvalue()


def inspect_json(out: str) -> dict:
    """The object `ditgate inspect --json` printed: the last line-initial `{` that parses (progress bars and
    warnings can come before it)."""
    stdout = out.split(STDERR_MARK, 1)[0]
    decoder = json.JSONDecoder()
    for match in reversed(list(re.finditer(r"(?m)^\{", stdout))):
        try:
            found, _ = decoder.raw_decode(stdout, match.start())
        except ValueError:
            continue
        if isinstance(found, dict) and "cache_dit" in found:
            return found
    return {}


def worker(job: dict) -> None:
    """One pipeline's build, inspect and run, in one process (the imports are paid once); each step's result is
    written to job["result"] as soon as it ends, so a pipeline killed at its time limit keeps the steps it did."""
    results: dict = {}

    def record(step: str, rc: int, out: str) -> None:
        results[step] = {"rc": rc, "out": out[-400000:]}  # all of an inspect report, the end of a long log
        Path(job["result"]).write_text(json.dumps(results))

    folder, image = job["folder"], job["image"]
    results["skip_parallel"] = job["skip_parallel"]
    record("build", *_step(["zoo", "build", f"zoo:{job['name']}", folder, "--overwrite"]))
    if results["build"]["rc"] != 0:
        return
    rc, out = _step(["inspect", folder, "--json", *image["inspect"]])
    record("inspect", rc, out)
    planners = {}
    if rc == 0:
        cache_dit = inspect_json(out).get("cache_dit") or {}
        planners = {k: any((cache_dit.get(k) or {}).values()) for k in PARALLEL_ROWS.values()}
    rows = ["cache"] + [row for row, key in PARALLEL_ROWS.items()
                        if not job["skip_parallel"] and (rc != 0 or planners.get(key))]
    results["rows"] = rows
    record("run", *_step(["run", folder, "--rows", ",".join(rows), "--out", job["run_dir"], *image["run"]]))
    if job.get("twin"):  # the twin of the tiny copy, built from its folder, and the same rows on it
        record("twin", *_step(["twin", folder, folder + ".twin", "--overwrite", *image["twin"]]))
        if results["twin"]["rc"] == 0:
            record("twin_run", *_step(["run", folder + ".twin", "--rows", ",".join(rows), "--out",
                                       folder + ".twin.run", *image["run"]]))


def survey_one(entry: Entry, work: Path, args, env: dict[str, str], image_options: dict[str, bool]) -> None:
    start = time.monotonic()
    folder = work / entry.name.replace("/", "+")
    run_dir = folder.with_name(folder.name + ".run")
    result = folder.with_name(folder.name + ".steps.json")
    result.unlink(missing_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # ditgate run refuses a folder holding an earlier run
    shutil.rmtree(f"{folder}.twin.run", ignore_errors=True)
    image = ["--image", str(work / "input.png")] if entry.image else []
    job = {"name": entry.name, "folder": str(folder), "run_dir": str(run_dir), "result": str(result),
           "skip_parallel": args.skip_parallel, "twin": args.twin, "image": {k: image if v else [] for k, v in image_options.items()}}
    try:
        subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], env=env, cwd=ROOT, check=False,
                       timeout=args.timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        late = None
    except subprocess.TimeoutExpired:
        late = f"timed out after {args.timeout:.0f} s"
    steps = json.loads(result.read_text()) if result.is_file() else {}
    steps["seconds"] = time.monotonic() - start
    if late:
        steps["late"] = late
    result.write_text(json.dumps(steps))
    judge(entry, work, steps, args.skip_parallel)


def judge(entry: Entry, work: Path, steps: dict, skip_parallel: bool) -> None:
    """The table cells and reasons of one pipeline, from its worker's steps and its run's report.json."""
    folder = work / entry.name.replace("/", "+")
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
            entry.reasons.append(f"{step}: {_last_error(got['out'])}{_where(got['out'])}")
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
        entry.reasons.append(f"baseline: {_row_reason(base)}")
    for row in rows:
        got = by_name.get(row)
        if got is None:
            entry.cells[row] = "FAIL"
            entry.reasons.append(f"{row}: {_last_error(out)}{_where(out)}" if report is None
                                 else f"{row}: not in the report")
            if report is None:
                break
            continue
        passed = got.get("status") == "passed"
        entry.cells[row] = "pass" if passed else "FAIL"
        if not passed and not base_failed:
            entry.reasons.append(f"{row}: {_row_reason(got)}")
    for row in rows:
        entry.cells.setdefault(row, "FAIL")
    if "twin" in steps:
        twin_cell(entry, steps, rows, Path(f"{folder}.twin.run") / "report.json")


def twin_cell(entry: Entry, steps: dict, rows: list[str], report_path: Path) -> None:
    """`agree` when every row's verdict on the twin equals the tiny copy's, else `DIFFER` and why."""
    if steps["twin"]["rc"] != 0 or not report_path.is_file():
        step = "twin" if steps["twin"]["rc"] != 0 else "twin_run"
        out = steps.get(step, {}).get("out", steps.get("late", "the worker ended before this step"))
        entry.cells["twin"] = "no twin" if step == "twin" else "DIFFER"
        entry.reasons.append(f"{step}: {_last_error(out)}{_where(out)}")
        return
    twin_rows = {r["name"]: r for r in json.loads(report_path.read_text()).get("rows", [])}
    differ = []
    for row in rows:
        got = twin_rows.get(row)
        verdict = "pass" if got and got.get("status") == "passed" else "FAIL"
        if verdict != entry.cells.get(row):
            why = _row_reason(got) if got else "not in the twin's report"
            differ.append(f"twin: {row} {entry.cells.get(row)} on the tiny copy, {verdict} on the twin"
                          + (f" ({why})" if verdict == "FAIL" else ""))
    entry.cells["twin"] = "DIFFER" if differ else "agree"
    entry.reasons += differ


def _row_reason(row: dict) -> str:
    """A failed row's first reason, with the innermost frame of its traceback where it raised."""
    why = str((row.get("reasons") or [row.get("status")])[0]).split(" — ")[0]  # the reason, not the hint after it
    error = row.get("error") or {}
    return f"{str(why)[:300]}{_where(error.get('traceback', '')) if isinstance(error, dict) else ''}"


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
        lines.append(f"- {c}: {ok} of {tried} tried")
    lines.append(f"- families covered: {len({e.family for e in done})}")
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
    if not args.collect:
        _test_image(work / "input.png")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), DITGATE_HOME=str(work / "home"))
    image_options = {cmd: _has_option(cmd, "--image") for cmd in ("run", "inspect")} | {"twin": False}  # its own
    if args.collect:  # the steps a survey into --work has finished so far, nothing run
        done = []
        for entry in todo:
            result = work / (entry.name.replace("/", "+") + ".steps.json")
            if result.is_file():
                judge(entry, work, json.loads(result.read_text()), args.skip_parallel)
                done.append(entry)
        todo = done
        wall = sum(e.seconds for e in todo)  # the pipelines' own time; the runs that wrote --work are not known
    for entry in todo if not args.collect else []:
        survey_one(entry, work, args, env, image_options)
        print(f"{entry.name:<28} " + " ".join(f"{c}={entry.cells.get(c, '-')}" for c in COLUMNS)
              + f"  {entry.seconds:.0f}s  {'; '.join(entry.reasons)[:200]}", flush=True)
    wall = wall if args.collect else time.monotonic() - start
    command = "python benchmarks/pipeline_survey.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    # --only updates its pipelines in the records of the last full survey; a full survey replaces them all
    records = args.out.with_suffix(".json")
    old = json.loads(records.read_text()) if (args.only or args.collect) and records.is_file() \
        else {"entries": [], "runs": []}
    merged = {e["name"]: Entry(**e) for e in old["entries"]}
    merged.update({e.name: e for e in todo})
    order = [e.name for e in entries(prefixes)]
    done = sorted(merged.values(), key=lambda e: order.index(e.name) if e.name in order else len(order))
    runs = [r for r in old["runs"] if not (args.collect and r.get("work") == str(work))] + [
        {"command": command, "pipelines": len(todo), "wall_s": round(wall, 1), "skip_parallel": args.skip_parallel,
         "work": str(work)}]
    records.parent.mkdir(parents=True, exist_ok=True)
    records.write_text(json.dumps({"entries": [asdict(e) for e in done], "runs": runs}, indent=1) + "\n")
    missing = uncovered(prefixes, {e.family for e in entries(prefixes)})
    text = markdown(done, missing, runs)
    kept = args.out.read_text().split(MARKER, 1)[1] if args.out.is_file() and MARKER in args.out.read_text() else "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n" + MARKER + kept)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
