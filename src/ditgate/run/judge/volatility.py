"""A cache row that no cache could pass on these weights is inconclusive, not failed.

On freshly initialised weights the residual a cache reuses can change by more than its own size from one step to
the next (ditgate.run.exec.probes.ResidualChange measures it on the caching-off twin): then every cache configuration fails the
latent gate however right the adapter is, and tuning the cache cannot help. A cache row is inconclusive when

- its adapter is proven: the caching-off twin matches the baseline exactly and every proof holds;
- it fails only the cache gate's own checks (against the baseline; a cache + CP row: it matches its cached
  single-process row by the CP gate and fails only the cache gate against the baseline);
- the largest step-to-step change measured is above `rules.residual_change.value` of gates.json.

Its reason names the measured change and says to judge cache quality on trained weights.
"""

from __future__ import annotations

from typing import Any


def limit(gates: dict | None) -> float:
    from ditgate.gates.verdicts import load_gates

    return float((gates or load_gates())["rules"]["residual_change"]["value"])


def measured(state) -> dict[str, Any] | None:
    """{"change", "list"} of the row's caching-off twin: the largest step-to-step change of any block list."""
    found = ((state.result or {}).get("facts") or {}).get("residual_change") if state is not None else None
    if not found:
        return None
    worst = max(found["per_list"], key=lambda k: found["per_list"][k]["max"])
    return {"change": found["per_list"][worst]["max"], "list": worst}


def _gate_only(verdict: dict[str, Any]) -> bool:
    """The verdict failed on its own checks alone: nothing it could not run, nothing else failed."""
    failed = [c for c in verdict.get("checks") or [] if not c["passed"]]
    return bool(failed) and not verdict.get("not_run") and (verdict.get("discriminates") or {}).get("passed", True)


def _why(state, states: dict[str, Any], bound: float, suffix: str) -> str | None:
    row, verdict = state.row, state.verdict or {}
    if not state.ran or not row.cache or state.passed or not verdict or not all(p["passed"] for p in state.proofs):
        return None
    if (state.twin or {}).get("status") == "failed":
        return None
    if row.phase == "cache":
        proven, base_failed = verdict.get("cache_off"), _gate_only(verdict)
        also = verdict.get("also") or []
        if also and not all(a["passed"] for a in also):
            return None
        cached = state
    else:  # cache + parallelism: exact against its cached row, the cache gate against the baseline
        cached = states.get(row.baseline)
        proven = ((cached.verdict or {}).get("cache_off") if cached is not None else None)
        failed_also = [a for a in verdict.get("also") or [] if not a["passed"]]
        base_failed = (bool(verdict.get("passed") is False) and all(c["passed"] for c in verdict.get("checks") or [])
                       and bool(failed_also) and all(a["phase"] == "cache" for a in failed_also))
    if not (proven and proven.get("passed") and base_failed):
        return None
    change = measured(states.get(cached.row.name + suffix))
    if change is None or change["change"] <= bound:
        return None
    return (f"inconclusive: the adapter is proven (caching off, its latents match the baseline's, max-abs "
            f"{proven.get('max_abs', 0):.3g}; every proof holds), but on these weights the residual the cache reuses "
            f"changes by up to {change['change']:.0%} of its size from one step to the next ({change['list']}; above "
            f"{bound:.0%}, rules.residual_change of gates.json, no cache can follow it): the failing cache gate says "
            "nothing about this integration; judge cache quality on trained weights, do not tune the cache for these")


def settle(states: dict[str, Any], gates: dict | None) -> None:
    """Mark the failing cache rows that no cache could pass on these weights inconclusive (`verdict.inconclusive`:
    the reason, also first among its reasons; advice to tune the cache is dropped)."""
    from ditgate.run.judge.cache_off import SUFFIX
    from ditgate.run.judge.hints import TUNING_MARK

    bound = limit(gates)
    for state in states.values():
        reason = _why(state, states, bound, SUFFIX)
        if reason:
            state.verdict["inconclusive"] = reason
            state.reasons = [reason] + [r for r in state.reasons if TUNING_MARK not in r]
