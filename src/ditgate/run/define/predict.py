"""Speedup predictions of a row from a FLOP count of its transformer (`ditgate.inspect.flops.profile`) and what its probes saw.

    transformer speedup  S = calls x F(1) / (computed x F(ranks) + cached x F_always(ranks))
    predicted speedup    1 / ((1 - p) + p / S)      (p: the baseline's time share spent in the transformer)

where F is the FLOPs of one transformer call per rank and F_always the part a cached call still runs (outside the
blocks, the first Fn and last Bn blocks). Communication is free in the prediction, so it is a ceiling. A measured
speedup under FAR_BELOW of its prediction is flagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from ditgate.core.errors import DitgateError
from ditgate.run.define.rows import Row


# A speedup below this fraction of its prediction is "far below". Measured efficiencies of sound rows lie above it:
# a static cache schedule on one H200 reaches 0.97-0.98 of its ideal (research anchor), and published Ulysses-2
# numbers for FLUX.1-dev reach 0.77-0.84 of 2x (cache-dit: H100 9.30 s -> 6.04 s; L20 23.25 s -> 13.87 s).
FAR_BELOW = 0.7


ABOVE_CEILING = 1.1  # efficiencies above this are reported as a timing problem, not as a gain


def max_fn(profile) -> int | None:
    """Blocks a cache preset may always run: the shortest cache unit minus one (one block left to cache)."""
    if profile is None or not profile.cache_units:
        return None
    return min(len(unit) for unit in profile.cache_units) - 1


_COUNTED: dict[tuple, tuple] = {}  # the profiles counted in this process (`ditgate serve` counts a run's before forking it)
COUNTED_KEPT = 8


def profile_for(model_path: Path, request, dtype: str):
    """The FLOP profile at the request's size, or (None, why not); counted once per process for the same model
    folder (its files' fingerprint), size and dtype."""
    from ditgate.core.warm import folder_fingerprint
    from ditgate.inspect.flops import profile as flops

    call = request.call
    if not (isinstance(call.get("height"), int) and isinstance(call.get("width"), int)):
        return None, "no --height/--width in the request: the FLOP model needs the size"
    size = (call["height"], call["width"], call.get("num_frames"), call.get("max_sequence_length"))
    key = (str(Path(model_path).resolve()), folder_fingerprint(model_path), size, dtype)
    if key not in _COUNTED:
        try:
            found = flops.analyze(model_path, height=size[0], width=size[1], frames=size[2], text_len=size[3],
                                  dtype=dtype), None
        except DitgateError as exc:
            found = None, str(exc)
        while len(_COUNTED) >= COUNTED_KEPT:
            _COUNTED.pop(next(iter(_COUNTED)))
        _COUNTED[key] = found
    return _COUNTED[key]


def _cached_calls(facts: dict[str, Any]) -> int:
    stats = (facts.get("cache") or [{}])[0]
    return len(stats.get("cached_steps", [])) + len(stats.get("cfg_cached_steps", []))


def predict(row: Row, result: dict[str, Any] | None, base: dict[str, Any] | None, profile) -> dict[str, Any] | None:
    """Predicted speedup of `row` over the baseline, and how the measurement compares (None: nothing to predict).

    Rows that compile or quantize get none, cache or not: their kernels differ from the baseline's, so time is no
    longer proportional to the FLOPs counted (on an H200 a compiled cached row ran 1.27x past the ceiling of its
    schedule). Reference rows get none either."""
    if profile is None or row.compile or row.quantize or not (row.cache or row.world_size > 1):
        return None
    if not (result and base and result.get("status") == "ok" and base.get("status") == "ok"):
        return None
    facts, base_facts = result.get("facts") or {}, base.get("facts") or {}
    calls = facts.get("transformer_calls") or 0
    if calls < 1:
        return None
    cached = _cached_calls(facts) if row.cache else 0
    cache = row.cache or {}
    fn, bn = int(cache.get("Fn_compute_blocks", 8)), int(cache.get("Bn_compute_blocks", 0))
    cp, tp = row.cp_size, row.tp_size
    full, always = profile.cost(cp=cp, tp=tp), profile.cost(profile.always_run(fn, bn), cp=cp, tp=tp)
    transformer = calls * profile.cost() / ((calls - cached) * full + cached * always)
    base_time, base_latency = base_facts.get("transformer_time_s"), base.get("latency_s")
    share = min(1.0, base_time / base_latency) if base_time and base_latency else None
    predicted = 1.0 / ((1 - share) + share / transformer) if share is not None else None
    measured = base_latency / result["latency_s"] if base_latency and result.get("latency_s") else None
    row_time = facts.get("transformer_time_s")
    out = {
        "calls": calls, "cached_calls": cached, "cp": cp, "tp": tp,
        "ideal_steps": calls / (calls - cached),  # total calls / computed calls
        "transformer": transformer,  # best transformer speedup (always-run blocks and ranks accounted)
        "transformer_share": share,  # of the baseline's latency
        "predicted": predicted,  # best end-to-end speedup
        "measured": measured,
        "efficiency": measured / predicted if measured and predicted else None,
        "transformer_measured": base_time / row_time if base_time and row_time else None,
    }
    out["transformer_efficiency"] = (out["transformer_measured"] / transformer if out["transformer_measured"]
                                     else None)
    out["far_below"] = out["efficiency"] is not None and out["efficiency"] < FAR_BELOW
    return out


def flops_summary(profile) -> dict[str, Any] | None:
    if profile is None:
        return None
    total = profile.flops()
    return {"transformer_class": profile.transformer_class, "tokens": profile.geometry.tokens,
            "image_tokens": profile.geometry.image_tokens, "text_tokens": profile.geometry.text_tokens,
            "forward_flops": total, "attention_share": profile.flops("attention") / total if total else 0.0,
            "gemm_share": profile.flops("gemm") / total if total else 0.0,
            "cp_share": profile.shares()["cp"], "tp_share": profile.shares()["tp"]}


def caveats(row: Row, result: dict[str, Any] | None, speedup: float | None, warmup: int, device: str) -> list[str]:
    """Why a measured speedup should not be read as a headline number (empty: nothing to say). A speedup above its
    ideal (the schedule's calls over computed calls, times the ranks) is not meaningful: the baseline was timed cold,
    or the timing is noise. Speedups measured without warm-up, or with more threads than the CPU has cores, are
    marked too."""
    if speedup is None or row.phase is None:
        return []
    notes = []
    facts = (result or {}).get("facts") or {}
    calls = facts.get("transformer_calls") or 0
    cached = _cached_calls(facts) if row.cache else 0
    if calls > cached and not (row.compile or row.quantize):
        ideal = calls / (calls - cached) * row.cp_size * row.tp_size
        if speedup > ideal * 1.02:
            notes.append(f"not meaningful: {speedup:.2f}x is above its ideal {ideal:.2f}x (a cold baseline or noise)")
    if not warmup:
        notes.append("measured without warm-up: the first call pays one-off costs (pass --warmup 1)")
    if str(device).startswith("cpu") and row.world_size > 1:
        import os

        threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if row.world_size * threads > cores:
            notes.append(f"measured on an oversubscribed CPU: {row.world_size} ranks x {threads} thread(s) on "
                         f"{cores} core(s)")
    return notes
