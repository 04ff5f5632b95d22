"""Every output of the call gated with its own modality's gate, not only the first.

A pipeline that returns frames and audio is judged on its frames by the row's verdict (ditgate.run.judge.gating);
each further output the row stored (`output_NAME.npy`, `result["outputs"]`, ditgate.run.exec.outputs.further) is
gated here against the same output of the row's baseline: its modality's checks, against a noise floor measured on
the calibration row's same output (audio always, every modality in reduced precision, as for a first output), and
for an exact phase the tensor rule on the output itself (the latents the run captures are the first output's). A
further output that fails fails the row, its reasons prefixed with the output's name; one that cannot be judged
(no gate for its layout, missing from the baseline or the row) is said so in the verdict, and decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.gates.calibration import gate_floor, reduced_precision


def _floor(runner, phase: str, name: str, modality: str, sample_rate: int | None, load: Callable) -> dict | None:
    """The `floor=` of the output's gate: the calibration row's same output against the baseline's (None: the
    defaults, when there is no calibration row or the floor does not apply)."""
    from ditgate.gates.floor import rule, thresholds
    from ditgate.gates.verdicts import compare
    from ditgate.run.define.rows import BASELINE, CALIBRATION
    from ditgate.run.judge.reduced_floor import _output_checks

    gates = runner.gate_table()
    reduced = reduced_precision(runner.model.dtype, gates)
    calib = runner.states.get(CALIBRATION.name)
    key = f"output_{name}"
    if not (reduced or modality == "audio") or calib is None or not calib.ran or load(CALIBRATION.name, key) is None:
        return None
    measured = compare(modality, load(BASELINE.name, key), load(CALIBRATION.name, key), sample_rate=sample_rate)
    if reduced:
        from ditgate.gates.verdicts import load_gates

        table = gates or load_gates()
        return thresholds(_output_checks(table, phase, modality), measured, rule(table)["final"],
                          bool(table["phases"][phase]["exact"]))["used"] or None
    return gate_floor(measured, gates) or None


def judge(runner, state, base, load: Callable) -> None:
    """Gate each further output of `state`'s row against `base`'s; adds `state.verdict["outputs"]` and reasons."""
    from ditgate.gates.verdicts import evaluate, json_ready, load_gates

    mine, theirs = (state.result or {}).get("outputs") or {}, (base.result or {}).get("outputs") or {}
    if state.verdict is None or not (mine or theirs):
        return
    gates = runner.gate_table() or load_gates()
    exact = bool(gates["phases"][state.row.phase]["exact"])
    found: dict[str, Any] = {}
    for name in dict.fromkeys([*theirs, *mine]):
        info, ours = theirs.get(name) or {}, mine.get(name) or {}
        key = f"output_{name}"
        why = info.get("why") or ours.get("why")
        if not why and (name not in theirs or name not in mine):
            why = f"output {name!r} is missing from {'the baseline' if name not in theirs else 'this row'}"
        pair = (load(base.row.name, key), load(state.row.name, key)) if not why else (None, None)
        if not why and any(x is None for x in pair):
            why = f"output {name!r} was not stored"
        if why:
            found[name] = {"judged": False, "why": why}
            continue
        modality, rate = info["modality"], info.get("sample_rate")
        try:
            floor = _floor(runner, state.row.phase, name, modality, rate, load)
            verdict = evaluate(state.row.phase, modality, *pair, latents=pair if exact else None,
                               dtype=runner.model.dtype, sample_rate=rate, floor=floor, gates=gates)
        except DitgateError as exc:  # a layout its gate cannot measure (too short, too small): said, not decided
            found[name] = {"judged": False, "modality": modality, "why": f"the {modality} gate cannot measure "
                           f"output {name!r}: {exc}"}
            continue
        found[name] = {"judged": True, "modality": modality, "floor": floor, **json_ready(verdict.to_dict()),
                       **{k: info[k] for k in ("item", "of") if k in info}}
        if exact:
            found[name]["note"] = "exact phase: the tensor rule applied to the output itself"
            found[name]["reasons"] = [_own(reason) for reason in verdict.reasons]
        if not verdict.passed:
            state.verdict["passed"] = False
            state.reasons.extend(f"{name} output ({modality}): {reason}" for reason in found[name]["reasons"])
    state.verdict["outputs"] = found


def _own(reason: str) -> str:
    """A tensor-rule reason about the output itself, not about latents (they were the output's own values)."""
    return reason.replace("latent ", "", 1) + " (the tensor rule on the output)" if reason.startswith("latent ") \
        else reason


def modalities(result: dict[str, Any] | None) -> list[str]:
    """The modalities of a stored row's further outputs (the runner adds the calibration row for an audio one)."""
    return [o["modality"] for o in ((result or {}).get("outputs") or {}).values() if o.get("modality")]


def batch_line(report: dict[str, Any]) -> list[str]:
    """report.md's line on a batch (several prompts or samples in one call): how many items, and that each was
    gated against the baseline's same item; nothing for a batch of one."""
    sizes = {out["of"] for row in report["rows"] for out in ((row.get("verdict") or {}).get("outputs") or {}).values()
             if out.get("of")}
    if not sizes:
        return []
    return [f"- batch of {max(sizes)}: every item compared with the baseline's same item, each under its modality's "
            "gate (item 1 is the row's output and the grid; the others are listed under \"Every output of the "
            "call\"); a row passes only when every item does"]


def lines(report: dict[str, Any]) -> list[str]:
    """report.md's section on the further outputs of each row: judged with which gate, or why not."""
    found = []
    for row in report["rows"]:
        for name, out in ((row.get("verdict") or {}).get("outputs") or {}).items():
            if not out.get("judged"):
                found.append(f"- {row['name']} / {name}: not judged — {out['why']}")
                continue
            metrics = ", ".join(f"{k} {v:.4g}" if isinstance(v, (int, float)) else f"{k} {v}"
                                for k, v in (out.get("metrics") or {}).items())
            verdict = "passed" if out["passed"] else "FAILED: " + "; ".join(out.get("reasons") or [])
            floor = " (floor from the calibration row)" if out.get("floor") else ""
            found.append(f"- {row['name']} / {name} ({out['modality']} gate{floor}): {metrics} — {verdict}")
    if not found:
        return []
    return ["", "## Every output of the call (beside the first: each gated with its modality's gate)", ""] + found
