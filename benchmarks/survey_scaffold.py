"""The pipeline survey's scaffold column (`python benchmarks/pipeline_survey.py --scaffold`).

For each survey pipeline the worker runs, as a user would, `ditgate scaffold DIR --out DIR.plugin.py --run-dir
DIR.scaffold.run` on the tiny copy's folder: inspect on the folder's call, write a plugin (its own `block_adapter`,
`cp_plan` and `tp_plan`: ditgate registers a plugin's planners ahead of cache-dit's, and the adapter is the plugin's,
so cache-dit's own adapter and planners play no part), then run cache, cp-ulysses-2 and tp-2 with that plugin on the
folder's float32 twin (a folder is not a zoo name, so the scaffold builds its twin). This module judges that step:
per row pass / FAIL with the row's reason, the plugin's NOT HANDLED notes (the observations the scaffold could not
turn into a plan), and which of cache-dit's failures on the tiny copy (the survey's own columns) the plugin fixes.
The cache row is judged as twin rows judge it (`ditgate.run.twinned.verdict`: caching off exact and the cache acted),
its approximation gate, which on the twin's random weights judges the weights, named beside it.

A pipeline counts towards the target (scaffolds pass all three rows unedited) when the scaffold's rows ran on the
twin with a baseline, or when the scaffold wrote no plugin for a pipeline that runs here (its inspect passed): that
is the scaffold's own failure. A pipeline that does not build or run here, whose twin is not built, or whose
baseline fails on the twin is "not applicable" (its reason is listed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from survey_steps import last_error, row_reason

ROWS = ("cache", "cp-ulysses-2", "tp-2")


def command(folder: str, plugin: str, run_dir: str) -> list[str]:
    """The `ditgate` arguments of the scaffold step (no --image: the twin's call uses its own seeded test image)."""
    return ["scaffold", folder, "--out", plugin, "--run-dir", run_dir, "--rows", ",".join(ROWS)]


def paths(folder: Path) -> tuple[Path, Path]:
    """The plugin file and the run folder of the scaffold step of the pipeline built in `folder`."""
    return folder.with_name(folder.name + ".plugin.py"), folder.with_name(folder.name + ".scaffold.run")


def not_handled(plugin: Path) -> list[str]:
    """The plugin's NOT HANDLED comments: what the scaffold observed and did not turn into a plan."""
    if not plugin.is_file():
        return []
    return [re.sub(r"^\s*#\s*", "", line).strip() for line in plugin.read_text().splitlines()
            if "NOT HANDLED" in line]


def judge(entry, folder: Path, steps: dict) -> None:
    """entry.scaffold = {"cells": {row: pass|FAIL}, "reasons": [...], "seconds", "not_handled": [...], "fixes":
    [...], "applicable": bool} from the worker's scaffold step and its run's report.json."""
    step = steps.get("scaffold")
    plugin, run_dir = paths(folder)
    got: dict = {"cells": {}, "reasons": [], "seconds": None, "not_handled": [], "fixes": [], "applicable": False}
    entry.scaffold = got
    if step is None:
        if steps.get("build", {}).get("rc", 1) != 0:
            got["reasons"].append("not built" if "build" in steps else
                                  f"build: {steps.get('late') or 'the worker ended before this step'}")
        else:
            got["reasons"].append(f"scaffold: {steps.get('late') or 'the worker ended before this step'}")
        return
    got["seconds"] = step.get("s")
    got["not_handled"] = not_handled(plugin)
    report_path = run_dir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    if report is None:  # refused before any row ran: no plugin written, or the twin not built
        got["reasons"].append(f"scaffold: {last_error(step['out'])}")
        # no plugin although the pipeline runs here (its inspect passed): the scaffold's own failure
        got["applicable"] = not plugin.is_file() and entry.cells.get("inspect") == "pass"
        for row in ROWS:
            got["cells"][row] = "FAIL" if got["applicable"] else "–"
        return
    by_name = {r["name"]: r for r in report.get("rows", [])}
    base = by_name.get("baseline")
    if base is None or base.get("status") not in ("passed", "reference"):
        got["reasons"].append(f"baseline on the twin: {row_reason(base) if base else 'not in the report'}")
        got["cells"] = {row: "–" for row in ROWS}
        return
    got["applicable"] = True
    from ditgate.run.twinned import verdict as structural

    def judged(r: dict) -> bool:  # a cache row on a twin: its structure, as twin rows judge it
        return r.get("status") == "passed" or (r.get("phase") == "cache" and r.get("status") != "error"
                                               and structural(r)["status"] == "passed")

    def statuses(report: Path) -> dict[str, str]:
        rows = json.loads(report.read_text()).get("rows", []) if report.is_file() else []
        return {r["name"]: "passed" if judged(r) else r.get("status") for r in rows}

    on_tiny = statuses(Path(f"{folder}.run") / "report.json")  # cache-dit's own rows (the survey's columns)
    on_twin = statuses(Path(f"{folder}.twin.run") / "report.json")  # and on the twin (the twin column)

    for row in ROWS:
        r = by_name.get(row)
        passed = r is not None and r.get("status") == "passed"
        if r is not None and not passed and judged(r):
            # the twin's random weights: its cache row is judged as twin rows judge it (the adapter applied with
            # caching off is exact, the cache acted), not by the approximation gate, which judges the weights
            passed = True
            got["reasons"].append(f"{row}: structure passes (caching off exact, the cache acted); the approximation "
                                  f"gate on the twin's random weights: {row_reason(r)}")
        got["cells"][row] = "pass" if passed else "FAIL"
        if not passed:
            got["reasons"].append(f"{row}: {row_reason(r) if r else 'not in the report'}")
        elif entry.cells.get(row) == "no planner":
            got["fixes"].append(f"{row} (cache-dit has no planner)")
        elif entry.cells.get(row) == "FAIL" and on_tiny.get(row, "failed") != "passed" \
                and on_twin.get(row, "failed") != "passed":
            # a fix only where cache-dit's own fails in structure (a cache row's approximation gate alone is the
            # weights'), on the tiny copy and on the same twin too (or no twin run says otherwise)
            got["fixes"].append(f"{row} (cache-dit's own fails" + (" on the tiny copy and on the twin)"
                                                                  if row in on_twin else " on the tiny copy)"))


def markdown(done: list) -> list[str]:
    """The scaffold column's table and totals (Markdown lines); empty when no entry has one."""
    have = [e for e in done if getattr(e, "scaffold", None)]
    if not have:
        return []
    lines = ["", "## Scaffold column (`--scaffold`): `ditgate scaffold DIR` with cache-dit's adapter and planners "
             "unused, rows on the folder's float32 twin", "",
             "| pipeline | cache | cp-ulysses-2 | tp-2 | fixes cache-dit's | s | reason; NOT HANDLED in the plugin |",
             "|---|---|---|---|---|---|---|"]
    for e in have:
        s = e.scaffold
        cells = " | ".join(s["cells"].get(r, "–") for r in ROWS)
        why = "; ".join(s["reasons"] + [f"plugin: {n}" for n in s["not_handled"]]).replace("|", "/")
        seconds = f"{s['seconds']:.0f}" if s.get("seconds") else "–"
        lines.append(f"| zoo:{e.name} | {cells} | {', '.join(s['fixes']) or '–'} | {seconds} | {why[:900]} |")
    applicable = [e for e in have if e.scaffold["applicable"]]
    whole = [e for e in applicable if all(e.scaffold["cells"].get(r) == "pass" for r in ROWS)]
    share = f" ({100 * len(whole) / len(applicable):.0f} %)" if applicable else ""
    times = sorted(e.scaffold["seconds"] for e in have if e.scaffold.get("seconds"))
    lines += ["", "Scaffold totals:", "",
              f"- all three rows pass unedited: {len(whole)} of {len(applicable)} pipelines where they apply{share} "
              f"(target >= 80 %); not applicable (not built, or no baseline on the twin): "
              f"{len(have) - len(applicable)}"]
    lines += [f"- {row}: {sum(e.scaffold['cells'].get(row) == 'pass' for e in applicable)} of {len(applicable)}"
              for row in ROWS]
    fixed = [f"zoo:{e.name} {', '.join(e.scaffold['fixes'])}" for e in have if e.scaffold["fixes"]]
    lines.append(f"- cache-dit's own adapter or planner fails (on the tiny copy, and on the twin where the twin column "
                 f"ran it) or is missing, and the scaffold's plugin passes: "
                 f"{len(fixed)} pipelines ({'; '.join(fixed) or 'none'})")
    if times:
        lines.append(f"- time per scaffold (inspect, write, twin, baseline and three rows, one core each): median "
                     f"{times[len(times) // 2]:.0f} s, max {times[-1]:.0f} s")
    return lines
