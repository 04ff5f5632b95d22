"""The spread of a row in report.md and matrix.md: over its prompts and seeds (each gate on the worst case,
ditgate.run.judge.variants) and over its timed repeats (min / median / max latency)."""

from __future__ import annotations

from typing import Any

from ditgate.gates.verdicts import format_value


def _fmt(metric: str, value: Any) -> str:
    try:
        return format_value(metric, float(value))
    except (TypeError, ValueError):
        return "–"


def variant_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table of every lossy row judged on several prompts and seeds."""
    folded = [r for r in rows if ((r.get("verdict") or {}).get("variants"))]
    if not folded:
        return []
    lines = ["", "## Prompts and seeds (each gate on the worst case)", "",
             "| row | cases | check | threshold | min | median | max | worst case | |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in folded:
        cases = len(r["verdict"]["variants"]["cases"])
        for c in r["verdict"]["checks"]:
            spread = c.get("spread") or {}
            lines.append(f"| {r['name']} | {cases} | {c['metric']} | {c['op']} "
                         f"{format_value(c['metric'], float(c['threshold']), threshold=True)} | "
                         + " | ".join(_fmt(c["metric"], spread.get(k)) for k in ("min", "median", "max"))
                         + f" | {c.get('worst_case', '–')} | {'pass' if c['passed'] else '**FAIL**'} |")
    return lines


def repeat_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Latency over the timed repeats of each row that has more than one."""
    timed = [r for r in rows if len(r.get("times") or []) > 1]
    if not timed:
        return []
    import statistics

    lines = ["", "## Latency over repeats (s)", "", "| row | repeats | min | median | max |", "|---|---|---|---|---|"]
    for r in timed:
        t = r["times"]
        lines.append(f"| {r['name']} | {len(t)} | {min(t):.3f} | {statistics.median(t):.3f} | {max(t):.3f} |")
    return lines


def lines(rows: list[dict[str, Any]]) -> list[str]:
    return variant_lines(rows) + repeat_lines(rows)
