"""The twin's part of a run's report: what the twin is, how its rows went, and each row's twin verdict beside the
model's own (`ditgate.run.twinned`)."""

from __future__ import annotations

from typing import Any

_MARK = {"passed": "pass", "failed": "FAIL", "inconclusive": "could not judge"}


def cell(row: dict[str, Any]) -> str:
    """The table cell of a row's twin verdict ("-" where the twin does not judge the row)."""
    twin = row.get("twin")
    return _MARK.get(twin["status"], twin["status"]) if twin else "-"


def headline(report: dict[str, Any]) -> list[str]:
    """The lines under the verdict: a twin-only run says what it is; a run with twin rows, whether structure was
    proven (every row the twin judges passed on it) or why not."""
    record = report.get("twin")
    if not record:
        return []
    twin = record.get("twin") or {}
    size = f"{twin['params']:,} parameters" if twin.get("params") else "its size unknown"
    if record.get("mode") == "only":
        return [f"- **twin only**: these rows ran on the float32 twin of {record['source']} ({size}, "
                f"{twin.get('folder')}); the model itself was not run: structure only, numerics unproven"]
    judged = [r for r in report["rows"] if r.get("twin")]
    if record.get("status") == "no rows":
        return [f"- twin: {record.get('detail')}"]
    if record.get("status") != "ran":
        return [f"- twin (float32): **could not run** — {record.get('detail')}: structure is not proven; a pass in "
                f"{report['dtype']} alone is numerics, not structure"]
    failed = [r["name"] for r in judged if r["twin"]["status"] == "failed"]
    unjudged = [r["name"] for r in judged if r["twin"]["status"] == "inconclusive"]
    state = ("structure proven on every row it judges" if not failed and not unjudged else
             f"FAILED on {', '.join(failed)}" if failed else f"could not judge {', '.join(unjudged)}")
    when = (f"{record.get('wall_s', 0):.1f} s beside the model's rows, {record.get('waited_s', 0):.1f} s of them "
            "waited for" if record.get("beside") else f"{record.get('wall_s', 0):.1f} s")
    return [f"- twin (float32, CPU, {size}): {state}; its report: {record.get('report')} ({when})"]


def section(report: dict[str, Any]) -> list[str]:
    """A section listing, per row the twin judges, its twin verdict with the numbers and reasons behind it."""
    judged = [r for r in report["rows"] if r.get("twin")]
    if not judged:
        return []
    lines = ["", "## Structure on the twin (float32) beside numerics on the model", "",
             f"| row | {report['dtype']} (model) | float32 (twin) | twin evidence |", "|---|---|---|---|"]
    for r in judged:
        t = r["twin"]
        shown = [f"{k} {v:.3g}" for k, v in (t.get("metrics") or {}).items() if v is not None]
        evidence = "; ".join(t.get("reasons", [])[:2] or shown) or "-"
        lines.append(f"| {r['name']} | {r['status'].upper()} | {_MARK.get(t['status'], t['status'])} | {evidence} |")
    lines += ["", "A row passes only when both pass: the twin proves the integration's structure where faults "
                  "cannot hide (float32 tensor rule), the model its numerics at scale (the calibrated floor)."]
    return lines


def wall_share(twin: dict[str, Any] | None) -> float | None:
    """The run's wall that went to the twin rows: all of theirs when they ran first, only what the run waited for
    them at its end when they ran beside the model's rows."""
    twin = twin or {}
    return twin.get("waited_s") if twin.get("beside") else twin.get("wall_s")
