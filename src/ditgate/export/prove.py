"""The runs an export rests on: the gate run with the integration file (a file that fails is not exported), the
proof with no file and the exported tree first on the import path, and the written test under pytest in a process
that never imports ditgate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ditgate.core import logs, plugin

# the default rows of each hook (the runner adds their baselines and the caching-off twin)
ROWS = {"block_adapter": ["cache"], "cp_plan": ["cp-ulysses-2", "cp-ring-2"], "tp_plan": ["tp-2"]}


def rows_for(hooks: list[str]) -> list[str]:
    return [row for hook in ("block_adapter", "cp_plan", "tp_plan") if hook in hooks for row in ROWS[hook]]


def hooks_of(rows: list[str]) -> set[str]:
    """The hooks a set of rows proves: a cache row the adapter, a CP row cp_plan, a TP row tp_plan."""
    from ditgate.run.define.rows import DEFAULT_ROWS

    found = set()
    for row in (r for r in DEFAULT_ROWS if r.name in rows):
        if row.cache:
            found.add("block_adapter")
        if row.cp_size > 1:
            found.add("cp_plan")
        if (row.parallel or {}).get("tp_size", 1) > 1:
            found.add("tp_plan")
    return found


def gate_run(model, integration: Path, rows: list[str], out: Path) -> dict[str, Any]:
    """The rows with the integration file, in this process (ranks forked from it)."""
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.runner import RunConfig, run

    chosen = rows_mod.select(list(rows_mod.DEFAULT_ROWS), ",".join(rows))
    return run(RunConfig(model=model, rows=chosen, out=out, integration=integration))


def _model_options(model, folder: Path) -> list[str]:
    """The command-line options that make `ditgate run` rebuild this model and its request."""
    call_file = folder / "call.json"
    call_file.write_text(json.dumps(model.request.call, default=str))
    options = [model.name, "--call-file", str(call_file), "--seed", str(model.request.seed), "--dtype", model.dtype,
               "--device", model.device]
    if model.pipeline:
        options += ["--pipeline", model.pipeline]
    if model.trust_remote_code:
        options.append("--trust-remote-code")
    if model.request.image and model.request.image != "generated":
        options += ["--image", model.request.image]
    return options


def proof_run(model, tree_root: Path, rows: list[str], out: Path, split_dims: dict | None) -> dict[str, Any]:
    """`ditgate run` in a fresh process with no integration file and `--cache-dit tree_root`; its report.json
    (an error report when it produced none)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "ditgate", "run", *_model_options(model, out.parent), "--rows", ",".join(rows),
               "--cache-dit", str(tree_root), "--out", str(out), "--json", "-q"]
    if split_dims:
        command += ["--cp-split-dims", plugin.format_split_dims(split_dims)]
    logs.progress(f"export: proving with no integration file, cache-dit from {tree_root}")
    done = subprocess.run(command, capture_output=True, text=True)
    report = out / "report.json"
    if report.is_file():
        return json.loads(report.read_text())
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"passed": False, "rows": [], "error": f"ditgate run exited {done.returncode}: {tail[0]}"}


PYTEST = ("import sys, pytest\n"
          "rc = pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:randomly', sys.argv[1]])\n"
          "if 'ditgate' in sys.modules:\n"
          "    print('ditgate was imported by the test run'); rc = 99\n"
          "sys.exit(int(rc))\n")


def pytest_run(test: Path, tree_root: Path) -> dict[str, Any]:
    """The written test under pytest, cache-dit from `tree_root`, in a process that never imports ditgate (checked
    at its end). Its outcome, wall time and last lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DITGATE_SKILL_DIR")}
    env["PYTHONPATH"] = str(tree_root)
    logs.progress(f"export: running {test.name} under pytest (no ditgate)")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PYTEST, str(test)], capture_output=True, text=True, env=env,
                          cwd=test.parent)
    wall = time.perf_counter() - start
    lines = (done.stdout + done.stderr).strip().splitlines()
    return {"passed": done.returncode == 0, "returncode": done.returncode, "wall_s": round(wall, 1),
            "summary": lines[-1] if lines else "", "tail": lines[-40:]}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def table(report: dict[str, Any]) -> str:
    """The gate table of a run: one line per gated row, its checks, what its feature did and why it failed."""
    lines = ["| row | verdict | checks | feature proof | why not |", "|---|---|---|---|---|"]
    for row in report.get("rows", []):
        verdict = row.get("verdict") or {}
        if not verdict and row.get("status") == "reference":
            continue
        checks = ", ".join(f"{c['metric']} {_fmt(c['value'])} {c['op']} {_fmt(c['threshold'])}"
                           for c in verdict.get("checks", []) if c["metric"] != "garbled")
        off = verdict.get("cache_off")
        if off:
            checks += f", caching off max-abs {_fmt(off.get('max_abs'))} <= {_fmt(off.get('limit'))}"
        proofs = "; ".join(p["detail"] for p in row.get("proofs", []))
        why = "; ".join(row.get("reasons") or []).replace("|", "/").replace("\n", " ")
        lines.append(f"| {row['name']} | {row.get('status')} | {checks} | {proofs} | {why} |")
    if report.get("error"):
        lines.append(f"| (run) | error | | | {report['error']} |")
    return "\n".join(lines) + "\n"
