"""Where a run's time went: the report's time summary (report.json `time`) and its table in report.md, and the
number format every report table uses (`fmt`)."""

from __future__ import annotations

from typing import Any

import numpy as np


OVERHEAD_PARTS = ("launch_s", "load_s", "restore_s", "setup_s")


def time_summary(rows: list[dict[str, Any]], wall_s: float | None, launch: str | None,
                 checks: list[dict[str, Any]] = (), twin_s: float | None = None) -> dict[str, Any]:
    """Where the run's wall time went: the rows' generations, and the overhead by kind (rows resumed from an
    earlier run count neither); `checks`: the results of the rows the verdicts use but the table does not show
    (sensitivity, cache-off twins), whose generations count as generations (`checks_s` of them); `other_s`: judging,
    the report, waiting for groups, the command's own start."""
    def timed(results):
        return [r for r in results if r.get("generate_s") is not None and not r.get("resumed")
                and not r.get("reused_from")]

    ran, checks_ran = timed(rows), timed(checks)
    ran += checks_ran
    generate = sum(r["generate_s"] for r in ran)
    parts = {k: sum((r.get("overhead") or {}).get(k, 0.0) for r in ran) for k in OVERHEAD_PARTS}
    twin_s = twin_s or 0.0  # the twin rows: a run of their own (RUN/twin), neither generations nor overhead here
    overhead = None if wall_s is None else wall_s - generate - twin_s
    return {"launch": launch, "generate_s": round(generate, 3), "twin_s": round(twin_s, 3),
            "checks_s": round(sum(r["generate_s"] for r in checks_ran), 3),
            "overhead_s": None if overhead is None else round(overhead, 3), **{k: round(v, 3) for k, v in parts.items()},
            "other_s": None if overhead is None else round(overhead - sum(parts.values()), 3),
            "overhead_per_row_s": None if overhead is None or not ran else round(overhead / len(ran), 3)}


def fmt(value: Any, spec: str) -> str:
    """A table cell: `value` in `spec`, "–" for None, "inf" for an infinity, strings as they are."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and np.isinf(value):
        return "inf"
    return format(value, spec)


def time_lines(report: dict[str, Any]) -> list[str]:
    """Per row: its generations and its overhead (launch, load, restore, setup); then the run's total."""
    rows = [r for r in report["rows"] if r.get("generate_s") is not None and not r["resumed"] and not r.get("reused_from")]
    t = report.get("time")
    if not rows or not t:
        return []
    lines = ["", f"## Where the time went (launch {t['launch']}; a multi-rank row: its rank 0)", "",
             "| row | generation (s) | launch | load | restore | setup | overhead (s) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r.get("overhead") or {}
        lines.append(f"| {r['name']} | {r['generate_s']:.2f} | " + " | ".join(fmt(o.get(k), ".2f") for k in OVERHEAD_PARTS)
                     + f" | {sum(o.get(k, 0.0) for k in OVERHEAD_PARTS):.2f} |")
    if t["overhead_s"] is not None:
        checks = (f" (the check rows not in this table, sensitivity and cache-off twins: {t['checks_s']:.1f} s)"
                  if t.get("checks_s") else "")
        twin = f" + twin rows {t['twin_s']:.1f} s" if t.get("twin_s") else ""
        lines += ["", f"Run: wall {report['wall_s']:.1f} s = generations {t['generate_s']:.1f} s{checks}{twin} + overhead "
                      f"{t['overhead_s']:.1f} s (launch {t['launch_s']:.1f}, load {t['load_s']:.1f}, restore "
                      f"{t['restore_s']:.1f}, setup {t['setup_s']:.1f}, judging and the rest {t['other_s']:.1f})."]
    return lines
