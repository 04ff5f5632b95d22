"""Can the run's gates tell a wrong output from a right one? A gate that cannot never passes a row.

A transformer that outputs exactly zero (a diffusers class's own initialisation can do that) makes every output the
same whatever the rows do: the cache row and a known-wrong CP plan then both pass at max-abs 0. The runner therefore
runs one more reference row, `sensitivity` (ditgate.run.define.rows.SENSITIVITY): the baseline with every transformer
output multiplied by (1 + 10 z), z ~ N(0, 1). Where the output depends on the transformer at all, that output is
far outside every gate; when a row's own gate passes it too, the gate cannot discriminate on this model and
request, and the row fails with that reason.
"""

from __future__ import annotations

from typing import Any


def check(phase: str, modality: str, reference: Any, perturbed: Any, **evaluate_kwargs: Any) -> dict[str, Any]:
    """{"passed": the gate of `phase` rejects the perturbed output, "detail": why} (`evaluate_kwargs` go to
    ditgate.gates.evaluate: dtype, sample_rate, floor, gates)."""
    from ditgate.core.errors import DitgateError
    from ditgate.gates.verdicts import evaluate

    if reference is None or perturbed is None:
        return {"passed": False, "detail": "the gate could not be checked against the sensitivity row: an output "
                "is missing"}
    if getattr(reference, "shape", None) != getattr(perturbed, "shape", None):
        return {"passed": True, "detail": "the perturbed output has another shape: the output depends on the "
                "transformer"}
    try:
        verdict = evaluate(phase, modality, reference, perturbed, **evaluate_kwargs)
    except DitgateError as exc:  # a non-finite perturbed output: it certainly moved
        return {"passed": True, "detail": f"the perturbed output cannot be scored ({exc}): it moved"}
    if not verdict.passed:
        return {"passed": True, "detail": "the gate rejects the baseline with every transformer output perturbed "
                f"(1 + 10 z): {'; '.join(verdict.reasons[:2])}"}
    shown = ", ".join(f"{k} {v:.4g}" for k, v in verdict.metrics.items() if isinstance(v, (int, float)))
    return {"passed": False, "detail": f"the {phase} gate cannot discriminate here: the baseline with every "
            f"transformer output multiplied by (1 + 10 z) passes it too ({shown}); the output does not depend on "
            "the transformer (does it output zeros? a class's own initialisation can), so no row can be judged"}


def judge(state, base_name: str, sensitivity, load, modality: str, **evaluate_kwargs: Any) -> None:
    """Fail the passing row `state` when its gate also passes the sensitivity row's output (`sensitivity`: that
    row's state, None when the run has none); `load(name, key)` reads a stored array."""
    if not (state.verdict and state.verdict["passed"] and sensitivity is not None and sensitivity.ran):
        return
    found = check(state.row.phase, modality, load(base_name, "output"), load(sensitivity.row.name, "output"),
                  sample_rate=state.result.get("sample_rate"), **evaluate_kwargs)
    state.verdict |= {"discriminates": found} | ({} if found["passed"] else {"passed": False})
    if not found["passed"]:
        state.reasons.append(found["detail"])
