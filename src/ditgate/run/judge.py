"""Gating a row against its further comparison rows (`Row.also_against`): cache + CP against the baseline too."""

from __future__ import annotations

from typing import Any, Callable


def judge_also(state, states: dict[str, Any], load: Callable, modality: str, *, dtype: str, floor, gates) -> None:
    """Add one verdict per further row to `state.verdict["also"]` and its reasons to `state.reasons`; the row
    passes only when every verdict passes."""
    from ditgate.gates.verdicts import evaluate

    also = []
    for name, phase in (state.row.also_against or {}).items():
        other = states.get(name)
        if other is None or not other.ran:
            also.append({"against": name, "phase": phase, "passed": False,
                         "reasons": [f"its comparison row {name!r} did not run"]})
        else:
            latents = (load(name, "latents"), load(state.row.name, "latents"))
            verdict = evaluate(phase, modality, load(name, "output"), load(state.row.name, "output"),
                               latents=latents if all(x is not None for x in latents) else None,
                               noise=load(name, "noise"), dtype=dtype, sample_rate=state.result.get("sample_rate"),
                               floor=floor, gates=gates)
            also.append({"against": name, "phase": phase, "passed": verdict.passed,
                         "metrics": verdict.to_dict().get("metrics"), "reasons": list(verdict.reasons)})
        state.reasons += [f"against {name} ({phase} gate): {r}" for r in also[-1]["reasons"]]
    if also:
        state.verdict["also"] = also
        state.verdict["passed"] = bool(state.verdict["passed"]) and all(a["passed"] for a in also)
