"""The cache-dit configuration objects a row asks for: its cache (DBCacheConfig, with a static schedule from a mask
and a TaylorSeer calibrator), its parallelism (ParallelismConfig) and its quantization (QuantizeConfig). Built
before anything loads, so a row cache-dit would refuse is refused by the preflight with its reason. Also
`--cache-config KEY=VALUE` read into cache-dit's own fields (`parse_cache_config`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.run.define.rows import _CACHE_EXTRAS, Row, RowError

MASK_POLICIES = ("slow", "medium", "fast", "ultra")  # cache_dit.steps_mask(mask_policy=...)


def cache_config(row: Row, steps: int | None):
    """cache_dit config objects for `row.cache`: (DBCacheConfig, calibrator config or None)."""
    import cache_dit

    fields = dict(row.cache or {})
    mask = fields.pop("mask", None)
    taylorseer = fields.pop("taylorseer", None)
    if mask is not None:
        if steps is None:
            raise DitgateError(f"row {row.name!r}: a cache mask needs the step count (--steps)")
        if mask == "alternate":  # compute the warm-up steps, then every other step, always the last one
            warm = int(fields.get("max_warmup_steps", 2))
            mask = [1 if i < warm or (i - warm) % 2 == 1 or i == steps - 1 else 0 for i in range(steps)]
        elif mask in MASK_POLICIES:  # cache-dit's predefined schedules (its CLI's --steps-mask --mask-policy)
            try:
                mask = list(cache_dit.steps_mask(total_steps=steps, mask_policy=mask))
            except (AssertionError, ValueError) as exc:
                raise DitgateError(f"row {row.name!r}: cache-dit has no {mask!r} schedule for {steps} steps: "
                                   f"{exc}") from None
            # warm-up would override the schedule's first cached steps: let the schedule decide alone
            fields.setdefault("max_warmup_steps", mask.index(0) if 0 in mask else steps)
        if not isinstance(mask, list) or len(mask) != steps or set(mask) - {0, 1}:
            raise DitgateError(f"row {row.name!r}: cache mask must be 'alternate', one of "
                               f"{', '.join(MASK_POLICIES)} or {steps} zeros and ones")
        fields.update(steps_computation_mask=mask, steps_computation_policy="static")
    if steps is not None:
        fields.setdefault("num_inference_steps", steps)
    try:
        config = cache_dit.DBCacheConfig(**fields)
    except TypeError as exc:
        raise DitgateError(f"row {row.name!r}: invalid cache field: {exc}") from None
    calibrator = None
    if taylorseer:
        calibrator = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=int(taylorseer))
    return config, calibrator


def parallelism_config(row: Row):
    import cache_dit

    fields = dict(row.parallel or {})
    extra = list(fields.pop("extra_parallel_modules", []))
    if fields.pop("text_encoder", False):
        extra.append("text_encoder")
    if fields.pop("vae", False):
        extra.append("vae")
    try:
        return cache_dit.ParallelismConfig(extra_parallel_modules=extra, **fields)
    except (TypeError, AssertionError, ValueError) as exc:
        raise DitgateError(f"row {row.name!r}: invalid parallel configuration: {exc}") from None


def quantize_config(row: Row):
    import cache_dit

    try:
        return cache_dit.QuantizeConfig(**row.quantize)
    except (TypeError, AssertionError, ValueError, ImportError) as exc:
        raise DitgateError(f"row {row.name!r}: invalid quantization: {exc}") from None


def parse_cache_config(items: list[str] | None) -> dict[str, Any]:
    """`--cache-config KEY=VALUE ...`: cache-dit's own DBCacheConfig field names (plus ditgate's `mask` and
    `taylorseer`), each value read as YAML (4, 0.08, true, [1, 0, 1], alternate)."""
    import cache_dit
    import yaml

    known = {f.name for f in dataclasses.fields(cache_dit.DBCacheConfig)} | _CACHE_EXTRAS
    fields: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RowError(f"--cache-config {item!r}: write KEY=VALUE (e.g. max_warmup_steps=4)")
        if key not in known:
            raise RowError(f"--cache-config {key}: not a field of cache_dit.DBCacheConfig; known: "
                           f"{', '.join(sorted(known))}")
        try:
            fields[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise RowError(f"--cache-config {key}: cannot read the value {text!r}") from None
    return fields
