"""A lossy row over several prompts and seeds (`--prompts`, `--seeds`; ditgate.run.define.variants): each gate on
its worst case, the spread recorded.

After every row is judged, `fold` takes each row that has variant rows (`cache` with `cache@p1s0`, ...) and
replaces each check of its verdict by the worst value any of them reached (the lowest PSNR, the highest latent
error), judged against the same threshold; the row fails when any variant failed or did not run, with that
variant's reasons. `verdict["variants"]` holds the cases and, per checked metric, min / median / max.
"""

from __future__ import annotations

import operator
import statistics
from typing import Any

from ditgate.gates.verdicts import OPS as GATE_OPS

OPS = GATE_OPS | {"==": operator.eq}  # the garbled-frames count is judged == 0


def _value(check: dict[str, Any]) -> float | None:
    try:
        value = float(check.get("value"))
    except (TypeError, ValueError):
        return None
    return None if value != value else value


def _worse(op: str, a: float, b: float, threshold: float) -> bool:
    """Whether `a` is further on the failing side of `threshold` than `b`."""
    if op in (">", ">="):
        return a < b
    if op in ("<", "<="):
        return a > b
    return abs(a - threshold) > abs(b - threshold)


def fold(states: dict[str, Any]) -> None:
    """Put each row with variants on its worst case (see the module's doc); `states`: the runner's RowStates."""
    for state in list(states.values()):
        cases = [s for s in states.values() if s.row.variant and s.row.variant.get("of") == state.row.name
                 and s.row.phase]
        if not cases or state.verdict is None:
            continue
        judged = [state] + [c for c in cases if c.verdict is not None]
        checks = []
        for check in state.verdict.get("checks") or []:
            worst, where = _value(check), state.row.name
            values = []
            for case in judged:
                mine = next((c for c in case.verdict.get("checks") or [] if c["metric"] == check["metric"]), None)
                value = _value(mine) if mine else None
                if value is None:
                    continue
                values.append(value)
                if worst is None or _worse(check["op"], value, worst, float(check["threshold"])):
                    worst, where = value, case.row.name
            passed = worst is not None and OPS[check["op"]](worst, float(check["threshold"]))
            checks.append(check | {"value": worst, "passed": bool(passed), "worst_case": where,
                                   "spread": {"min": min(values), "median": statistics.median(values),
                                              "max": max(values)} if values else None})
        failed = [c for c in cases if c.verdict is None or not c.verdict.get("passed")]
        state.verdict["checks"] = checks
        state.verdict["variants"] = {"cases": [state.row.name] + [c.row.name for c in cases],
                                     "failed": [c.row.name for c in failed]}
        if failed or not all(c["passed"] for c in checks):
            state.verdict["passed"] = False
        for case in failed:
            why = "; ".join(case.reasons) or ("it did not run" if case.verdict is None else "its gate failed")
            state.reasons.append(f"on {case.row.name} (prompt {_prompt_no(case.row.name)}, seed "
                                 f"{case.row.variant.get('seed')}): {why}")


def _prompt_no(name: str) -> str:
    tag = name.rsplit("@", 1)[-1]
    return tag[1:tag.index("s")] if tag.startswith("p") and "s" in tag else "?"
