"""Judging a finished row: its verdict against its baseline, the caching-off and sensitivity checks, its further
comparison rows (`Row.also_against`: cache + CP against the baseline too), its proofs, and the noise floor (audio;
every modality in reduced precision: ditgate.run.reduced_floor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ditgate.gates.calibration import reduced_precision
from ditgate.run import reduced_floor, store
from ditgate.run.hints import hint_for


def judge_also(state, states: dict[str, Any], load: Callable, modality: str, *, dtype: str, floor_of: Callable,
               gates) -> None:
    """Add one verdict per further row to `state.verdict["also"]` and its reasons to `state.reasons`; the row
    passes only when every verdict passes. `floor_of(phase)`: the `floor=` of that phase's gate."""
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
                               floor=floor_of(phase), gates=gates)
            also.append({"against": name, "phase": phase, "passed": verdict.passed,
                         "metrics": verdict.to_dict().get("metrics"), "reasons": list(verdict.reasons)})
        state.reasons += [f"against {name} ({phase} gate): {r}" for r in also[-1]["reasons"]]
    if also:
        state.verdict["also"] = also
        state.verdict["passed"] = bool(state.verdict["passed"]) and all(a["passed"] for a in also)


def judge_row(runner, state) -> None:
    """Gate `state`'s row against its baseline: the phase's verdict, the caching-off twin, the sensitivity
    reference, the further comparison rows and the proofs; reasons go to `state.reasons`."""
    from ditgate.gates.verdicts import evaluate, json_ready
    from ditgate.run import cache_off, discrimination, proofs
    from ditgate.run.rows import SENSITIVITY

    row = state.row
    if row.phase is None or not state.ran:
        if state.result and state.result.get("status") == "error":
            error = state.result["error"]
            hint = hint_for(row.phase, error.get("message", ""), error)
            state.reasons.append(error["message"] + (f" — {hint}" if hint else ""))
        return
    base = runner.states.get(row.baseline)
    if base is None or not base.ran:
        state.reasons.append(f"its baseline row {row.baseline!r} did not run")
        return
    load = lambda name, key: store.load_array(runner.run_dir, name, key)
    latents = (load(base.row.name, "latents"), load(row.name, "latents"))
    modality, gates = state.result["modality"], runner.gate_table()
    if reduced_precision(runner.cfg.dtype, gates):
        floor = reduced_floor.row_floor(runner, row.phase, modality)
    else:
        floor = audio_floor(runner) if modality == "audio" else {}
    verdict = evaluate(row.phase, modality, load(base.row.name, "output"), load(row.name, "output"),
                       latents=latents if all(x is not None for x in latents) else None,
                       noise=load(base.row.name, "noise"), dtype=runner.cfg.dtype,
                       sample_rate=state.result.get("sample_rate"), floor=floor.get("used"),
                       gates=gates)
    state.verdict = verdict.to_dict() | ({"floor": json_ready(floor)} if floor else {})
    state.reasons.extend(verdict.reasons)
    if row.cache and row.phase == "cache" and not verdict.passed and verdict.reasons:
        state.reasons.extend(_latents_only_hint(verdict))
    if reduced_precision(runner.cfg.dtype, gates):
        reduced_floor.judge_exact(runner, state, base.row.name, load)
    cache_off.judge(state, base.row.name, runner.states.get(row.name + cache_off.SUFFIX), load, runner.cfg.dtype,
                    gates)
    discrimination.judge(state, base.row.name, runner.states.get(SENSITIVITY.name), load, modality,
                         dtype=runner.cfg.dtype, floor=floor.get("used"), gates=gates)
    judge_also(state, runner.states, load, modality, dtype=runner.cfg.dtype, gates=gates,
               floor_of=lambda phase: (reduced_floor.row_floor(runner, phase, modality)
                                       if reduced_precision(runner.cfg.dtype, gates) else floor).get("used"))
    for proof in proofs.check(row, state.result["facts"], base.row, base.result["facts"]):
        state.proofs.append(proof.to_dict())
        if not proof.passed:
            state.reasons.append(f"{proof.feature} did not act: {proof.detail}")


def audio_floor(runner) -> dict[str, Any]:
    """The noise floor for audio rows: what the calibration row measured against the baseline, and the part of
    it the gate uses (`used`, the `floor=` of gates.evaluate; None: the defaults of gates.json)."""
    from ditgate.gates.calibration import gate_floor
    from ditgate.metrics import audio_metrics, tensor_metrics
    from ditgate.run.rows import BASELINE, CALIBRATION

    calib, base = runner.states.get(CALIBRATION.name), runner.states.get(BASELINE.name)
    if calib is None or base is None or not (calib.ran and base.ran) or any(
            s.result.get("modality") != "audio" for s in (calib, base)):
        return {"measured": None, "used": None,
                "note": "no calibration row and baseline to measure the floor with: the defaults apply"}
    if calib.measured is None:
        load = lambda name, key: store.load_array(runner.run_dir, name, key)
        calib.measured = audio_metrics(load(BASELINE.name, "output"), load(CALIBRATION.name, "output"),
                                       base.result["sample_rate"])
        latents = load(BASELINE.name, "latents"), load(CALIBRATION.name, "latents")
        if all(x is not None for x in latents):  # shown next to the rows' latent checks, not a threshold
            calib.measured["cosine"] = tensor_metrics(*latents)["cosine"]
    return {"measured": calib.measured, "used": gate_floor(calib.measured, runner.gate_table()) or None}


_LATENT_METRICS = {"max_abs", "rel_error", "cosine", "disp_rel_error"}


def _latents_only_hint(verdict) -> list[str]:
    """What to try when a cache row fails on its latents alone while its output passes."""
    failed = [c for c in verdict.checks if not c.passed]
    if not failed or any(c.metric not in _LATENT_METRICS for c in failed):
        return []
    return [("only the latents fail while the output passes: this model's residuals change too fast for this cache "
            "configuration; try a stricter threshold (--cache-config residual_diff_threshold=0.04), more warm-up "
            "steps (--cache-config max_warmup_steps=4), more computed blocks (--cache-config Fn_compute_blocks=2) "
            "or a calibrator (--cache-config taylorseer=1), and keep the one whose latents pass")]
