"""Rows of a run in reduced precision, judged against the calibration row's floor (ditgate.gates.floor): what the
floor is (measured once per run), the thresholds it gives each phase, the first-step check and the latent check of
exact rows, and the report's lines about it.
"""

from __future__ import annotations

from typing import Any

from ditgate.run.exec import files as store

_CACHE_LATENT = "disp_rel_error"


def measure(runner) -> dict[str, Any] | None:
    """The calibration row against the baseline: {"output": metrics, "latents": metrics, "first_step": summary,
    "modality"}; None when either did not run. Measured once per run (kept on the runner)."""
    from ditgate.gates.first_step import summary
    from ditgate.gates.verdicts import compare
    from ditgate.metrics import tensor_metrics
    from ditgate.run.define.rows import BASELINE, CALIBRATION

    if hasattr(runner, "_reduced_floor"):
        return runner._reduced_floor
    calib, base = runner.states.get(CALIBRATION.name), runner.states.get(BASELINE.name)
    found = None
    if calib is not None and base is not None and calib.ran and base.ran:
        load = lambda name, key: store.load_array(runner.run_dir, name, key)
        modality = base.result["modality"]
        found = {"modality": modality,
                 "output": compare(modality, load(BASELINE.name, "output"), load(CALIBRATION.name, "output"),
                                   sample_rate=base.result.get("sample_rate")),
                 "latents": None, "first_step": None}
        latents = load(BASELINE.name, "latents"), load(CALIBRATION.name, "latents")
        if all(x is not None for x in latents):
            found["latents"] = tensor_metrics(*latents, load(BASELINE.name, "noise"))
        first = load(BASELINE.name, "first_step"), load(CALIBRATION.name, "first_step")
        if all(x is not None for x in first):
            found["first_step"] = summary(*first)
        calib.measured = dict(found["output"]) | ({"cosine": found["latents"]["cosine"]}
                                                  if modality == "audio" and found["latents"] else {})
    runner._reduced_floor = found
    return found


def _output_checks(gates: dict, phase: str, modality: str) -> list[dict]:
    spec = gates["phases"][phase]
    if modality == "audio":
        return list(spec["modalities"].get("audio", {}).get("checks", [])) + gates["rules"]["audio"]["checks"]
    return list(spec["modalities"].get(modality, {}).get("checks", [])) + gates["rules"]["region"]["checks"]


def row_floor(runner, phase: str, modality: str) -> dict[str, Any]:
    """What the floor does to `phase`'s gate: {"measured", "used" (the floor= of gates.evaluate), "derived",
    "at_default", "exact", "note"}."""
    from ditgate.gates.floor import rule, thresholds
    from ditgate.gates.verdicts import load_gates

    gates = runner.gate_table() or load_gates()
    found = measure(runner)
    if found is None or found["modality"] != modality:
        return {"measured": None, "used": None, "note": "no calibration row and baseline to measure the floor with: "
                "the defaults apply"}
    exact = bool(gates["phases"][phase]["exact"])
    spec = rule(gates)
    out = thresholds(_output_checks(gates, phase, modality), found["output"], spec["final"], exact)
    used = dict(out["used"])
    if phase == "cache" and found["latents"]:  # the cache row's latent rule: the looser of default and factor x floor
        default = next((c["value"] for c in gates["phases"]["cache"]["modalities"].get("latent", {}).get("checks", [])
                        if c["metric"] == _CACHE_LATENT), None)
        calibrated = float(spec["cache_latents"]["factor"]) * float(found["latents"].get(_CACHE_LATENT) or 0.0)
        if default is not None and calibrated > default:
            used[_CACHE_LATENT] = calibrated
    note = None
    if out["at_default"]:
        note = (f"the calibration row equalled the baseline in {', '.join(out['at_default'])}: its floor is "
                "infinite there and unusable, so those checks keep their defaults")
    return {"measured": found["output"], "used": used or None, "derived": out["derived"],
            "at_default": out["at_default"], "exact": exact, "latents": found["latents"], "note": note}


def judge_exact(runner, state, base_name: str, load) -> None:
    """An exact row in reduced precision: the first-step check and the latents against the floor; each adds its
    checks to the verdict and fails the row with a reason."""
    from ditgate.gates import first_step
    from ditgate.gates.floor import latent_check
    from ditgate.gates.verdicts import json_ready, load_gates

    gates = runner.gate_table() or load_gates()
    if state.verdict is None or not gates["phases"][state.row.phase]["exact"]:
        return
    found = measure(runner)
    if found is not None and found["latents"]:
        result, reason = latent_check(state.verdict.get("metrics") or {}, found["latents"], gates)
        if result is not None:
            state.verdict["latent_floor"] = json_ready(vars(result))
            if reason:
                state.verdict["passed"] = False
                state.reasons.append(reason)
    base, cand = load(base_name, "first_step"), load(state.row.name, "first_step")
    if base is None or cand is None:
        return
    if base.shape != cand.shape:  # rank 0 holds only its part: the plan gathers outside the transformer
        state.verdict["first_step"] = {"passed": True, "checks": [], "reasons": [], "skipped": (
            f"not checked: rank 0's first-step output is {tuple(cand.shape)}, the baseline's {tuple(base.shape)} "
            "(the output is gathered after the transformer)")}
    else:
        state.verdict["first_step"] = json_ready(first_step.check(
            base, cand, floor=(found or {}).get("first_step"), cp_size=state.row.cp_size, gates=gates))
    if not state.verdict["first_step"]["passed"]:
        state.verdict["passed"] = False
        state.reasons.extend(state.verdict["first_step"]["reasons"])
