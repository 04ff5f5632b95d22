"""FLOPs and bytes of one transformer forward, counted on a real forward at full size without memory.

The transformer is built from its `config.json` on PyTorch's `meta` device (shapes only, no storage) and called
once at the requested size. Every aten op of that call is counted:

- **attention**: each `scaled_dot_product_attention` call, with PyTorch's own formula (two batched matmuls,
  4·B·H·Sq·Sk·D FLOPs; the decomposed kernel on `meta` is not counted again). Bytes: Q, K, V and the output, as a
  fused kernel reads and writes them.
- **gemm**: matmuls and convolutions outside attention, with `torch.utils.flop_counter`'s formulas. Bytes: the
  operands and the result.
- **other**: everything else (norms, activations, RoPE, copies): no FLOPs counted; bytes are inputs plus outputs of
  each op as if nothing were fused, an upper bound of its memory traffic. Views move no bytes.

Each op is charged to the block running it (forward hooks on every block of the transformer's block lists) or to
"outside" (embeddings, final norm and projection). From those counts follow the predictions ditgate shows next to
measured speedups: the best speedup of a cache schedule, the share of the work context and tensor parallelism
divide, and the bytes Ulysses, ring attention and tensor parallelism communicate.

Which tensors a layer sees depends on the model family (input layout, VAE scale factor, patch size, TP plan), so a
small table (`FAMILIES`) describes Flux, Wan and Qwen-Image; other transformer classes are refused with a clear
error. The TP plans in that table copy the layer names of cache-dit 1.5.3's planners
(`cache_dit/distributed/transformers/{flux,wan,qwen_image}.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditgate.inspect.flops.models import Family, FlopsError, Geometry, family_of, source
from ditgate.inspect.flops.count import KINDS, Segment, _Counter, _counting, build_meta

DEGREES = (2, 4, 8)  # parallel degrees the profile reports




# ------------------------------------------------------------------------------------------------ model families


























# ------------------------------------------------------------------------------------------------ model sources








# ------------------------------------------------------------------------------------------------ counting




















# ------------------------------------------------------------------------------------------------ the profile


@dataclass
class Profile:
    """Costs of one transformer forward at one size (batch 1)."""

    model: str
    transformer_class: str
    family: str
    height: int
    width: int
    frames: int | None
    dtype: str
    geometry: Geometry
    heads: int | None
    parameters: int
    weight_bytes: int
    segments: list[Segment]
    block_lists: dict[str, int]  # list name -> number of blocks
    cache_units: list[list[str]]  # the block sequences cache-dit gives Fn/Bn to, as segment names
    calls_per_step: int
    family_spec: Family = field(repr=False, default=None)

    # -- totals --------------------------------------------------------------------------------------------
    def flops(self, kind: str | None = None) -> int:
        return sum(s.flops[kind] if kind else s.total_flops for s in self.segments)

    def bytes(self, kind: str | None = None) -> int:
        return sum(s.bytes[kind] if kind else s.total_bytes for s in self.segments)

    def by_name(self) -> dict[str, Segment]:
        return {s.name: s for s in self.segments}

    def cost(self, names=None, cp: int = 1, tp: int = 1) -> float:
        segments = self.segments if names is None else [self.by_name()[n] for n in names]
        return sum(s.cost(cp, tp) for s in segments)

    # -- predictions ---------------------------------------------------------------------------------------
    def always_run(self, fn: int, bn: int) -> list[str]:
        """Segments a cached step still runs: everything outside the blocks, the first `fn` and last `bn` blocks
        of each cache unit."""
        names = ["outside"]
        for unit in self.cache_units:
            fn_, bn_ = min(fn, len(unit)), min(bn, len(unit))
            names += unit[:fn_] + (unit[len(unit) - bn_:] if bn_ else [])
        return list(dict.fromkeys(names))

    def cache_speedup(self, calls: int, cached: int, fn: int, bn: int, cp: int = 1, tp: int = 1) -> dict[str, Any]:
        """Best transformer speedup of caching `cached` of `calls` transformer calls with Fn=`fn`, Bn=`bn`."""
        if calls <= 0 or not 0 <= cached < calls:
            raise FlopsError(f"cached calls must be between 0 and {calls - 1}, got {cached}")
        full = self.cost(cp=cp, tp=tp)
        partial = self.cost(self.always_run(fn, bn), cp=cp, tp=tp)
        computed = calls - cached
        return {"calls": calls, "computed": computed, "cached": cached, "Fn": fn, "Bn": bn,
                "cached_call_share": partial / full,
                "ideal_steps": calls / computed,
                "ideal": calls * full / (computed * full + cached * partial)}

    def parallel_speedup(self, cp: int = 1, tp: int = 1) -> float:
        """Best transformer speedup on cp x tp ranks if communication were free."""
        return self.cost() / self.cost(cp=cp, tp=tp)

    def shares(self) -> dict[str, float]:
        total = self.flops() or 1
        d = {k: sum(s.divides[k] for s in self.segments) for k in ("both", "cp", "tp", "none")}
        return {"cp": (d["both"] + d["cp"]) / total, "tp": (d["both"] + d["tp"]) / total}

    def comm_bytes(self, kind: str, n: int) -> float:
        """Bytes one rank sends per transformer forward with `n` ranks of `kind` (ulysses, ring, tp)."""
        if n < 2:
            return 0.0
        if kind == "ulysses":  # all-to-all of the local Q, K, V and output: (n-1)/n of each leaves the rank
            return sum(s.ulysses_bytes for s in self.segments) / n * (n - 1) / n
        if kind == "ring":  # each rank's K, V chunk visits the n-1 others
            return sum(s.ring_bytes for s in self.segments) / n * (n - 1)
        if kind == "tp":  # ring all-reduce of Rowwise outputs (2(n-1)/n), all-gather of Replicate outputs
            reduce = sum(s.tp_reduce_bytes for s in self.segments)
            gather = sum(s.tp_gather_bytes for s in self.segments)
            return reduce * 2 * (n - 1) / n + gather * (n - 1) / n
        raise FlopsError(f"unknown communication kind {kind!r}")

    def divisible(self, cp: int = 1, tp: int = 1) -> str | None:
        """Why `cp` x `tp` ranks cannot split this model at this size; None when they can."""
        if self.heads and self.heads % (cp * tp):
            return f"the transformer's {self.heads} attention heads do not divide over {cp * tp} ranks"
        if cp > 1 and self.geometry.image_tokens % cp:
            return f"{self.geometry.image_tokens} image tokens at this size are not divisible by {cp} CP ranks"
        return None

    # -- output --------------------------------------------------------------------------------------------
    def to_dict(self, steps: int | None = None, fn: int = 1, bn: int = 0) -> dict[str, Any]:
        total = self.flops()
        lists = {}
        by_name = self.by_name()
        for name, count in self.block_lists.items():
            segs = [by_name[f"{name}.{i}"] for i in range(count)]
            lists[name] = {"blocks": count,
                           "flops_per_block": {k: segs[0].flops[k] for k in KINDS},
                           "bytes_per_block": {k: segs[0].bytes[k] for k in KINDS},
                           "flops": sum(s.total_flops for s in segs),
                           "share": sum(s.total_flops for s in segs) / total if total else 0.0}
        outside = by_name["outside"]
        data = {
            "model": self.model, "transformer_class": self.transformer_class, "family": self.family,
            "size": {"height": self.height, "width": self.width, "frames": self.frames},
            "dtype": self.dtype,
            "tokens": {"image": self.geometry.image_tokens, "text": self.geometry.text_tokens,
                       "total": self.geometry.tokens},
            "heads": self.heads, "parameters": self.parameters, "weight_bytes": self.weight_bytes,
            "forward": {
                "flops": total, "bytes": self.bytes(),
                "flops_by_kind": {k: self.flops(k) for k in KINDS},
                "bytes_by_kind": {k: self.bytes(k) for k in KINDS},
                "attention_share": self.flops("attention") / total if total else 0.0,
                "gemm_share": self.flops("gemm") / total if total else 0.0,
                "intensity": {k: (self.flops(k) / self.bytes(k) if self.bytes(k) else None)
                              for k in ("attention", "gemm")},
            },
            "block_lists": lists,
            "outside": {"flops": {k: outside.flops[k] for k in KINDS}, "share": outside.total_flops / total
                        if total else 0.0},
            "blocks": [s.to_dict() for s in self.segments if s.name != "outside"],
            "calls_per_step": self.calls_per_step,
            "parallel": {
                "cp_share": self.shares()["cp"], "tp_share": self.shares()["tp"],
                "degrees": {str(n): {
                    "refused": {"ulysses": self.divisible(cp=n), "tp": self.divisible(tp=n)},
                    "ideal_speedup": {"cp": self.parallel_speedup(cp=n), "tp": self.parallel_speedup(tp=n)},
                    "bytes_per_rank_per_step": {
                        k: self.comm_bytes(k, n) * self.calls_per_step for k in ("ulysses", "ring", "tp")},
                } for n in DEGREES},
            },
        }
        if steps:
            data["cache"] = cache_schedules(self, steps, fn, bn)
        return data


def cache_schedules(profile: Profile, steps: int, fn: int = 1, bn: int = 0) -> dict[str, Any]:
    """Best speedups of cache-dit's predefined static schedules (`cache_dit.steps_mask` policies) at `steps`."""
    import cache_dit

    out: dict[str, Any] = {"steps": steps, "Fn": fn, "Bn": bn,
                           "always_run_share": profile.cost(profile.always_run(fn, bn)) / profile.cost(),
                           "schedules": {}}
    for policy in ("slow", "medium", "fast", "ultra"):
        try:
            mask = cache_dit.steps_mask(total_steps=steps, mask_policy=policy)
        except (AssertionError, ValueError) as exc:
            out["schedules"][policy] = {"refused": str(exc)}
            continue
        calls = steps * profile.calls_per_step
        cached = (steps - sum(mask)) * profile.calls_per_step
        out["schedules"][policy] = {"mask": "".join(map(str, mask))} | profile.cache_speedup(calls, cached, fn, bn)
    return out


def analyze(model: str | Path, *, height: int, width: int, frames: int | None = None, text_len: int | None = None,
            dtype: str = "bfloat16", calls_per_step: int | None = None) -> Profile:
    """Count one transformer forward of `model` at `height` x `width` (x `frames`) on the meta device."""
    import torch

    from ditgate.core.components import block_lists

    for label, value in (("height", height), ("width", width), ("frames", frames), ("text tokens", text_len)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise FlopsError(f"{label} must be a positive integer, got {value!r}")
    src = source(model)
    family = family_of(src.class_name)
    if frames is not None and not family.video:
        raise FlopsError(f"--frames: {src.class_name} makes images, not videos; leave --frames out")
    if family.video and frames is None:
        frames = src.defaults.get("num_frames")
    if text_len is None:
        text_len = src.defaults.get("max_sequence_length") or family.text_len
    geometry = family.geometry(src.transformer, src.vae, height, width, frames, text_len)
    meta = build_meta(src.transformer, dtype)
    counter = _Counter(family)
    with _counting(counter, meta), torch.no_grad():
        try:
            meta(**family.inputs(src.transformer, geometry, meta.dtype), return_dict=False)
        except (RuntimeError, ValueError, IndexError) as exc:  # a size its config cannot take (a position table)
            size = "x".join(str(v) for v in (frames if family.video else None, height, width) if v)
            raise FlopsError(f"{src.class_name} cannot run at {size} with its config: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    lists = {name: len(blocks) for name, blocks in block_lists(meta).items()}
    units = [[f"{n}.{i}" for i in range(c)] for n, c in lists.items()]
    if family.cache_merges_lists:
        units = [[name for unit in units for name in unit]]
    params = list(meta.parameters())
    return Profile(
        model=str(model), transformer_class=src.class_name, family=family.name, height=height, width=width,
        frames=frames if family.video else None, dtype=str(meta.dtype).removeprefix("torch."), geometry=geometry,
        heads=src.transformer.get("num_attention_heads"), parameters=sum(p.numel() for p in params),
        weight_bytes=sum(p.numel() * p.element_size() for p in params), segments=list(counter.segments.values()),
        block_lists=lists, cache_units=units, calls_per_step=calls_per_step or family.calls_per_step,
        family_spec=family)
