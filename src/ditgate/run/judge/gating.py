"""Judging a finished row: its verdict against its baseline, the caching-off and sensitivity checks, its further
comparison rows (`Row.also_against`: cache + CP against the baseline too), its proofs, and the noise floor (audio;
every modality in reduced precision: ditgate.run.judge.reduced_floor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ditgate.gates.calibration import reduced_precision
from ditgate.run.judge import outputs as further_outputs
from ditgate.run.judge import reduced_floor
from ditgate.run.exec import files as store
from ditgate.run.judge.hints import hint_for, ranked


def gated(phase: str, modality: str, base_name: str, name: str, load: Callable, *, dtype: str, gates: dict | None,
          sample_rate: int | None = None, floor=None) -> tuple[dict[str, Any], list[str]]:
    """The verdict of row `name` against row `base_name` under `phase`'s gate, as a dict, and its reasons. A latent
    check the gate has but that cannot run (no final latents, no initial noise) fails it, saying why."""
    from ditgate.gates.verdicts import evaluate, load_gates

    gates = load_gates() if gates is None else gates
    latents, noise = (load(base_name, "latents"), load(name, "latents")), load(base_name, "noise")
    missing = _missing_latent_input(phase, modality, dtype, gates, latents, noise, (base_name, name))
    verdict = evaluate(phase, modality, load(base_name, "output"), load(name, "output"),
                       latents=None if missing or any(x is None for x in latents) else latents, noise=noise,
                       dtype=dtype, sample_rate=sample_rate, floor=floor, gates=gates)
    record, reasons = verdict.to_dict(), list(verdict.reasons)
    if missing:  # a check that cannot run never passes
        record.update(passed=False, not_run=missing)
        reasons.append(missing)
    return record, reasons


def _missing_latent_input(phase: str, modality: str, dtype: str, gates: dict, latents: tuple, noise,
                          names: tuple[str, str]) -> str | None:
    """Why the latent checks this row's gate has cannot run (None: they can, or it has none)."""
    from ditgate.gates.verdicts import latent_checks_for

    needed = latent_checks_for(phase, modality, dtype, gates)
    if not needed:
        return None
    metrics = ", ".join(dict.fromkeys(c["metric"] for c in needed))
    absent = [name for name, value in zip(names, latents) if value is None]
    if absent:
        return (f"the latent checks ({metrics}) could not run: {' and '.join(absent)} captured no final latents "
                "(the pipeline took no step callback and stepped no `scheduler`)")
    if noise is None and any(c["metric"] == "disp_rel_error" for c in needed):
        return (f"the latent checks ({metrics}) could not run: disp_rel_error needs {names[0]}'s initial latents, "
                "which could not be read in the layout of its final latents")
    return None


def judge_also(state, states: dict[str, Any], load: Callable, modality: str, *, dtype: str, floor_of: Callable,
               gates) -> None:
    """Add one verdict per further row to `state.verdict["also"]` and its reasons to `state.reasons`; the row
    passes only when every verdict passes. `floor_of(phase)`: the `floor=` of that phase's gate."""
    also = []
    for name, phase in (state.row.also_against or {}).items():
        other = states.get(name)
        if other is None or not other.ran:
            also.append({"against": name, "phase": phase, "passed": False,
                         "reasons": [f"its comparison row {name!r} did not run"]})
        else:
            record, reasons = gated(phase, modality, name, state.row.name, load, dtype=dtype, gates=gates,
                                    sample_rate=state.result.get("sample_rate"), floor=floor_of(phase))
            also.append({"against": name, "phase": phase, "passed": record["passed"],
                         "metrics": record.get("metrics"), "reasons": reasons})
        state.reasons += [f"against {name} ({phase} gate): {r}" for r in also[-1]["reasons"]]
    if also:
        state.verdict["also"] = also
        state.verdict["passed"] = bool(state.verdict["passed"]) and all(a["passed"] for a in also)


def judge_row(runner, state) -> None:
    """Gate `state`'s row against its baseline: the phase's verdict, the caching-off twin, the sensitivity
    reference, the further comparison rows and the proofs; reasons go to `state.reasons`."""
    from ditgate.gates.verdicts import json_ready
    from ditgate.run.judge import cache_off, discrimination, proofs
    from ditgate.run.define.rows import FAULT_SIZE, SENSITIVITY

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
    modality, gates = state.result["modality"], runner.gate_table()
    def floor_for(phase: str) -> dict[str, Any]:  # the floor `phase`'s gate uses in this run
        if reduced_precision(runner.model.dtype, gates):
            return reduced_floor.row_floor(runner, phase, modality)
        return audio_floor(runner) if modality == "audio" else {}  # measured once, kept on the calibration row

    floor = floor_for(row.phase)
    record, reasons = gated(row.phase, modality, base.row.name, row.name, load, dtype=runner.model.dtype, gates=gates,
                            sample_rate=state.result.get("sample_rate"), floor=floor.get("used"))
    state.verdict = record | ({"floor": json_ready(floor)} if floor else {})
    state.reasons.extend(reasons)
    further_outputs.judge(runner, state, base, load)  # frames and audio: every output with its own gate
    if reduced_precision(runner.model.dtype, gates):
        reduced_floor.judge_exact(runner, state, base.row.name, load)
    cache_off.judge(state, base.row.name, runner.states.get(row.name + cache_off.SUFFIX), load, runner.model.dtype,
                    gates)
    state.reasons = ranked(state.verdict, state.reasons, record) if row.cache and row.phase == "cache" \
        else state.reasons
    discrimination.judge(state, base.row.name, [runner.states.get(FAULT_SIZE.name), runner.states.get(
        SENSITIVITY.name)], load, modality, memo=runner.judged, dtype=runner.model.dtype, floor=floor.get("used"),
        gates=gates)
    judge_also(state, runner.states, load, modality, dtype=runner.model.dtype, gates=gates,
               floor_of=lambda phase: floor_for(phase).get("used"))
    for proof in proofs.check(row, state.result["facts"], base.row, base.result["facts"]):
        state.proofs.append(proof.to_dict())
        if not proof.passed:
            what = "left a transformer out" if proofs.partial(proof.coverage) else "did not act"
            state.reasons.append(f"{proof.feature} {what}: {proof.detail}")


def audio_floor(runner) -> dict[str, Any]:
    """The noise floor for audio rows: what the calibration row measured against the baseline, and the part of
    it the gate uses (`used`, the `floor=` of gates.evaluate; None: the defaults of gates.json)."""
    from ditgate.gates.calibration import gate_floor
    from ditgate.metrics import audio_metrics, tensor_metrics
    from ditgate.run.define.rows import BASELINE, CALIBRATION

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



def check_judgeable_size(call: dict) -> None:
    """Refuse, before any row runs, a picture smaller than the SSIM window: no row of it could be judged."""
    from ditgate.core.errors import DitgateError
    from ditgate.metrics.kernel import WINDOW

    small = {k: call[k] for k in ("height", "width") if isinstance(call.get(k), int) and call[k] < WINDOW}
    if small:
        sizes = ", ".join(f"{k} {v}" for k, v in small.items())
        raise DitgateError(f"{sizes}: smaller than the {WINDOW}x{WINDOW} SSIM window, so no row could be judged; "
                           f"use at least {WINDOW} (the pipeline may round the size down further)")
