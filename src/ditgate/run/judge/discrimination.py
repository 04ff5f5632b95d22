"""Can the run's gates tell a wrong output from a right one, and how small a fault do they reject?

A gate passes a row only if it would have rejected a wrong output. The runner runs the baseline again with every
transformer output multiplied by (1 + s z), z ~ N(0, 1), at two sizes (rows of ditgate.run.define.rows):

- `sensitivity-fault-size` (when a row with an exact gate is gated): s = `rules.sensitivity.fault_size` of
  gates.json, the size of the smallest planted fault of the test suite (the relative RMS change it makes to the
  transformer's output on the first call). A gate that rejects it rejects a fault of realistic size: its power is
  stated as that. A run whose gates are all lossy (`--rows cache`) does not run it: a lossy gate has to accept its
  feature's own error, larger than that (measured: the cache gate passes it on zoo:flux and zoo:wan).
- `sensitivity` (only when a gated row's gate is lossy or uses a noise floor: cache, quantization, audio, reduced
  precision): s = `rules.sensitivity.coarse` (10), far outside every gate unless the output does not depend on
  the transformer (a transformer that outputs exactly zero, as a class's own initialisation can).

A gate that rejects the fault-sized perturbation discriminates, with that power. One that passes it but rejects the
coarse one discriminates, more coarsely than a realistic fault, and the report says so (a lossy gate has to accept
its feature's own approximation; a reduced-precision floor sits near one rounding, where the smallest fault is).
A gate that passes every perturbation that ran cannot discriminate on this model and request: the row fails with
that reason. The power (`discriminates.power`: the smallest size rejected, or None) is in report.json and report.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def sizes(gates: dict | None) -> tuple[float, float]:
    """(fault_size, coarse) of gates.json rules.sensitivity."""
    from ditgate.gates.verdicts import load_gates

    rule = (gates or load_gates())["rules"]["sensitivity"]
    return float(rule["fault_size"]), float(rule["coarse"])


def needed(phases: list[str], modalities: list[str | None], dtype: str, gates: dict | None) -> list:
    """The sensitivity rows a run with gated rows of `phases` (outputs of `modalities`) needs, in the order to run."""
    from ditgate.gates.calibration import uses_floor
    from ditgate.gates.verdicts import load_gates
    from ditgate.run.define.rows import FAULT_SIZE, SENSITIVITY

    if not phases:
        return []
    table = gates or load_gates()
    fault, coarse = sizes(table)
    exact = [bool(table["phases"].get(p, {}).get("exact")) for p in phases]
    rows = [dataclasses.replace(FAULT_SIZE, perturb=fault)] if any(exact) else []
    if not all(exact) or any(uses_floor(m, dtype, table) for m in modalities):
        rows.append(dataclasses.replace(SENSITIVITY, perturb=coarse))
    return rows


def check(phase: str, modality: str, reference: Any, perturbed: Any, size: float,
          **evaluate_kwargs: Any) -> dict[str, Any]:
    """{"passed": the gate of `phase` rejects the output perturbed by (1 + size z), "detail": why} (`evaluate_kwargs`
    go to ditgate.gates.evaluate: dtype, sample_rate, floor, gates)."""
    from ditgate.core.errors import DitgateError
    from ditgate.gates.verdicts import evaluate

    what = f"the baseline with every transformer output multiplied by (1 + {size:g} z)"
    if reference is None or perturbed is None:
        return {"passed": False, "detail": f"the gate could not be checked against {what}: an output is missing"}
    if getattr(reference, "shape", None) != getattr(perturbed, "shape", None):
        return {"passed": True, "detail": f"{what} has another shape: the output depends on the transformer"}
    try:
        verdict = evaluate(phase, modality, reference, perturbed, **evaluate_kwargs)
    except DitgateError as exc:  # a non-finite perturbed output: it certainly moved
        return {"passed": True, "detail": f"{what} cannot be scored ({exc}): it moved"}
    if not verdict.passed:
        return {"passed": True, "detail": f"the gate rejects {what}: {'; '.join(verdict.reasons[:2])}"}
    shown = ", ".join(f"{k} {v:.4g}" for k, v in verdict.metrics.items() if isinstance(v, (int, float)))
    return {"passed": False, "detail": f"{what} passes the {phase} gate ({shown})"}


def _content(arrays: dict[str, Any]) -> dict[str, str | None]:
    """Each array's digest: dtype, shape and bytes (None for a missing one)."""
    import hashlib

    import numpy as np

    found = {}
    for name, array in arrays.items():
        if array is None:
            found[name] = None
            continue
        array = np.ascontiguousarray(array)
        found[name] = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()
    return found


def judge(state, base_name: str, checks: list, load, modality: str, memo=None, **evaluate_kwargs: Any) -> None:
    """Record the power of the passing row `state`'s gate (`checks`: the sensitivity rows' states that ran, smallest
    perturbation first) and fail the row when its gate rejects none of them; `load(name, key)` reads an array.
    `memo(inputs, compute)`: the result of `compute()` for these inputs, kept across runs when the run reuses stored
    rows (the runner's: a check of a reused baseline against a reused sensitivity row is not measured again);
    `inputs` names everything the check reads, the arrays by their content."""
    checks = [c for c in checks if c is not None and c.ran]
    if not (state.verdict and state.verdict["passed"] and checks):
        return
    fault_size, passed = sizes(evaluate_kwargs.get("gates"))[0], []
    for sensitivity in checks:  # the row's whole gate: its latent checks too (an exact phase's tensor rule)
        source = sensitivity.row.baseline or base_name  # what was perturbed: the plain baseline (not a tiled one)
        arrays = {"reference": load(source, "output"), "perturbed": load(sensitivity.row.name, "output"),
                  "latents": load(source, "latents"), "perturbed_latents": load(sensitivity.row.name, "latents"),
                  "noise": load(source, "noise")}
        latents = (arrays["latents"], arrays["perturbed_latents"])

        def compute(size: float = sensitivity.row.perturb) -> dict[str, Any]:
            return check(state.row.phase, modality, arrays["reference"], arrays["perturbed"], size,
                         sample_rate=state.result.get("sample_rate"),
                         latents=None if any(x is None for x in latents) else latents, noise=arrays["noise"],
                         **evaluate_kwargs)

        inputs = {"check": "discrimination", "phase": state.row.phase, "modality": modality,
                  "size": sensitivity.row.perturb, "sample_rate": state.result.get("sample_rate"),
                  "arrays": _content(arrays) if memo else None, "evaluate": evaluate_kwargs}
        found = memo(inputs, compute) if memo else compute()
        if found["passed"]:
            break
        passed.append(found["detail"])
    power = sensitivity.row.perturb if found["passed"] else None
    detail = found["detail"] if found["passed"] else (
        f"the {state.row.phase} gate cannot discriminate here: {'; '.join(passed)}; the output does not depend on "
        "the transformer (does it output zeros? a class's own initialisation can), so no row can be judged")
    if found["passed"] and passed:
        detail += (f"; coarser than a fault of realistic size: {passed[0]} (the smallest planted fault, "
                   "rules.sensitivity.fault_size)")
    record = {"passed": found["passed"], "detail": detail, "power": power, "fault_size": fault_size,
              "tried": [c.row.perturb for c in checks]}
    state.verdict |= {"discriminates": record} | ({} if found["passed"] else {"passed": False})
    if not found["passed"]:
        state.reasons.append(detail)


def power_lines(rows: list[dict[str, Any]]) -> list[str]:
    """report.md's section on the power of each gated row's gate (empty when no row was checked)."""
    found = [(r["name"], r.get("phase"), (r.get("verdict") or {}).get("discriminates")) for r in rows]
    found = [(name, phase, d) for name, phase, d in found if d and "power" in d]
    if not found:
        return []
    lines = ["", "## Power of the gates (the smallest perturbation of every transformer output each row's gate "
             "rejects; rules.sensitivity.fault_size is the size of the smallest planted fault)", "",
             "| row | gate | rejects (1 + s z) from s = | a fault of realistic size |", "|---|---|---|---|"]
    for name, phase, d in found:
        power = "none: cannot discriminate" if d["power"] is None else f"{d['power']:g}"
        realistic = ("rejected" if d["power"] is not None and d["power"] <= d["fault_size"] else "not rejected"
                     if d["fault_size"] in d.get("tried", [d["fault_size"]]) else "not tried (a lossy gate)")
        lines.append(f"| {name} | {phase} | {power} | {realistic} (s = {d['fault_size']:g}) |")
    return lines
