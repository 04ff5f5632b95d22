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

import contextlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError

KINDS = ("attention", "gemm", "other")
DEGREES = (2, 4, 8)  # parallel degrees the profile reports


class FlopsError(DitgateError):
    """The FLOPs of this model cannot be counted (unknown family, missing config, bad size)."""


# ------------------------------------------------------------------------------------------------ model families


@dataclass(frozen=True)
class Geometry:
    """Token counts of one transformer call at a size."""

    image_tokens: int
    text_tokens: int
    latent_shape: tuple[int, ...]  # the transformer's `hidden_states` shape (batch 1)

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.text_tokens


@dataclass(frozen=True)
class Family:
    name: str
    prefix: str  # transformer class-name prefix
    geometry: Callable[[dict, dict, int, int, int | None, int], Geometry]
    inputs: Callable[[dict, Geometry, Any], dict]
    text_len: int  # default text tokens when the request does not fix them
    calls_per_step: int  # default transformer calls per denoising step (separate CFG: 2)
    tp_sharded: tuple[str, ...]  # Linear names (suffixes) whose weights TP shards
    tp_rowwise: tuple[str, ...]  # ... of which RowwiseParallel: their output is all-reduced
    tp_gathered: tuple[str, ...]  # ... of which ColwiseParallel(output_layouts=Replicate()): output all-gathered
    cache_merges_lists: bool  # cache-dit caches all block lists as one sequence (Flux's dummy-block adapter)
    video: bool = False


def _meta(shape, dtype):
    import torch

    return torch.empty(*shape, device="meta", dtype=dtype)


def _packed_2x2(scale: int, height: int, width: int) -> tuple[int, int]:
    """Latent height/width after the Flux / Qwen-Image pipelines round the size, then 2x2 packing."""
    lh, lw = 2 * (height // (scale * 2)), 2 * (width // (scale * 2))
    if lh == 0 or lw == 0:
        raise FlopsError(f"{height}x{width} is smaller than one latent patch (VAE scale {scale} x 2)")
    return lh // 2, lw // 2


def _flux_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae.get("block_out_channels") else 8
    h, w = _packed_2x2(scale, height, width)
    return Geometry(h * w, text_len, (1, h * w, cfg.get("in_channels", 64)))


def _flux_inputs(cfg, geo: Geometry, dtype) -> dict:
    s, t = geo.image_tokens, geo.text_tokens
    kw = {"hidden_states": _meta(geo.latent_shape, dtype),
          "encoder_hidden_states": _meta((1, t, cfg.get("joint_attention_dim", 4096)), dtype),
          "pooled_projections": _meta((1, cfg.get("pooled_projection_dim", 768)), dtype),
          "timestep": _meta((1,), dtype), "img_ids": _meta((s, 3), dtype), "txt_ids": _meta((t, 3), dtype)}
    if cfg.get("guidance_embeds"):
        kw["guidance"] = _meta((1,), dtype)
    return kw


def _wan_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    if frames is None:
        raise FlopsError("a video model needs --frames")
    downsample = vae.get("temperal_downsample")
    spatial = vae.get("scale_factor_spatial") or (2 ** len(downsample) if downsample else 8)
    temporal = vae.get("scale_factor_temporal") or (2 ** sum(map(bool, downsample)) if downsample else 4)
    lf, lh, lw = (frames - 1) // temporal + 1, height // spatial, width // spatial
    pt, ph, pw = cfg.get("patch_size", (1, 2, 2))
    if lf % pt or lh % ph or lw % pw or lh == 0 or lw == 0:
        raise FlopsError(f"{frames} frames of {height}x{width} give latents {lf}x{lh}x{lw}, which patches "
                         f"{pt}x{ph}x{pw} do not divide")
    return Geometry((lf // pt) * (lh // ph) * (lw // pw), text_len, (1, cfg.get("in_channels", 16), lf, lh, lw))


def _wan_inputs(cfg, geo: Geometry, dtype) -> dict:
    return {"hidden_states": _meta(geo.latent_shape, dtype), "timestep": _meta((1,), dtype),
            "encoder_hidden_states": _meta((1, geo.text_tokens, cfg.get("text_dim", 4096)), dtype)}


def _qwen_geometry(cfg, vae, height, width, frames, text_len) -> Geometry:
    downsample = vae.get("temperal_downsample")
    scale = 2 ** len(downsample) if downsample else 8
    h, w = _packed_2x2(scale, height, width)
    return Geometry(h * w, text_len, (1, h * w, cfg.get("in_channels", 64)))


def _qwen_inputs(cfg, geo: Geometry, dtype) -> dict:
    h_w = geo.image_tokens
    # img_shapes only feeds RoPE, whose tables are sized by the product; any factorisation counts the same
    side = int(math.isqrt(h_w))
    shape = (1, side, h_w // side) if side * (h_w // side) == h_w else (1, 1, h_w)
    kw = {"hidden_states": _meta(geo.latent_shape, dtype),
          "encoder_hidden_states": _meta((1, geo.text_tokens, cfg.get("joint_attention_dim", 3584)), dtype),
          "timestep": _meta((1,), dtype), "img_shapes": [[shape]]}
    if cfg.get("guidance_embeds"):
        kw["guidance"] = _meta((1,), dtype)
    return kw


FAMILIES: tuple[Family, ...] = (
    Family("flux", "FluxTransformer2DModel", _flux_geometry, _flux_inputs, text_len=512, calls_per_step=1,
           tp_sharded=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                       "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                       "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear",
                       "proj_mlp", "proj_out", "norm.linear"),
           tp_rowwise=("attn.to_out.0", "ff.net.2", "attn.to_add_out", "ff_context.net.2", "proj_out"),
           tp_gathered=("norm1.linear", "norm1_context.linear", "norm.linear"),
           cache_merges_lists=True),
    Family("wan", "WanTransformer3DModel", _wan_geometry, _wan_inputs, text_len=512, calls_per_step=2,
           tp_sharded=("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                       "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"),
           tp_rowwise=("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2"), tp_gathered=(),
           cache_merges_lists=False, video=True),
    Family("qwen-image", "QwenImageTransformer2DModel", _qwen_geometry, _qwen_inputs, text_len=128,
           calls_per_step=1,
           tp_sharded=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "img_mod.1", "img_mlp.net.0.proj",
                       "img_mlp.net.2", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                       "txt_mod.1", "txt_mlp.net.0.proj", "txt_mlp.net.2"),
           tp_rowwise=("attn.to_out.0", "img_mlp.net.2", "attn.to_add_out", "txt_mlp.net.2"),
           tp_gathered=("img_mod.1", "txt_mod.1"),
           cache_merges_lists=False),
)


def family_of(class_name: str) -> Family:
    for family in FAMILIES:
        if class_name.startswith(family.prefix):
            return family
    known = ", ".join(f.prefix for f in FAMILIES)
    raise FlopsError(f"no FLOP model for transformer class {class_name!r}; ditgate counts {known}")


# ------------------------------------------------------------------------------------------------ model sources


@dataclass(frozen=True)
class Source:
    """The configs a count needs: the transformer's, the VAE's (may be empty) and request defaults."""

    transformer: dict
    vae: dict
    defaults: dict  # the zoo's call arguments, when the model is a zoo model
    where: str

    @property
    def class_name(self) -> str:
        return str(self.transformer.get("_class_name", ""))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FlopsError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise FlopsError(f"{path} is not valid JSON: {exc}") from None


def source(model: str | Path) -> Source:
    """Configs of `model`: zoo:NAME, a pipeline folder, a transformer folder, or a transformer config.json."""
    from ditgate import zoo

    if zoo.is_spec(str(model)):
        path = zoo.materialize(str(model))
    else:
        path = Path(model).expanduser()
        if not path.exists():
            raise FlopsError(f"{path} does not exist: give zoo:NAME, a pipeline folder, a transformer folder or a "
                             "transformer config.json")
    if path.is_file():
        return Source(_read_json(path), {}, {}, str(path))
    if (path / "model_index.json").is_file():
        vae_file = path / "vae" / "config.json"
        return Source(_read_json(path / "transformer" / "config.json"),
                      _read_json(vae_file) if vae_file.is_file() else {},
                      zoo.read_meta(path).get("call", {}), str(path))
    if (path / "config.json").is_file():
        return Source(_read_json(path / "config.json"), {}, {}, str(path))
    raise FlopsError(f"{path} holds neither model_index.json nor config.json")


# ------------------------------------------------------------------------------------------------ counting


@dataclass
class Segment:
    """Costs charged to one block (or to everything outside the blocks)."""

    name: str
    flops: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    bytes: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    # FLOPs by what divides them: "cp" (per-token work), "tp" (sharded by the TP plan), "both", "none"
    divides: dict[str, int] = field(default_factory=lambda: {"both": 0, "cp": 0, "tp": 0, "none": 0})
    ulysses_bytes: int = 0  # Q+K+V+output bytes of its attention calls (the tensors Ulysses all-to-alls)
    ring_bytes: int = 0  # K+V bytes of its attention calls (what ring attention passes around)
    tp_reduce_bytes: int = 0  # outputs of RowwiseParallel layers (all-reduced)
    tp_gather_bytes: int = 0  # outputs of Replicate-output ColwiseParallel layers (all-gathered)

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def cost(self, cp: int = 1, tp: int = 1) -> float:
        """FLOPs one rank runs for this segment with `cp` context and `tp` tensor-parallel ranks."""
        d = self.divides
        return d["both"] / (cp * tp) + d["cp"] / cp + d["tp"] / tp + d["none"]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flops": dict(self.flops), "bytes": dict(self.bytes),
                "divides": dict(self.divides), "ulysses_bytes": self.ulysses_bytes, "ring_bytes": self.ring_bytes,
                "tp_reduce_bytes": self.tp_reduce_bytes, "tp_gather_bytes": self.tp_gather_bytes}


def _nbytes(value) -> int:
    import torch

    total = 0
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, (list, tuple)):
            total += _nbytes(item)
    return total


class _Counter:
    """Charges every op of a forward to the current segment (see the module docstring)."""

    def __init__(self, family: Family, batch: int = 1):
        self.family = family
        self.batch = batch
        self.segments: dict[str, Segment] = {"outside": Segment("outside")}
        self.current = "outside"
        self.linears: list[str] = []  # stack of the Linear modules being run (qualified names)
        self.in_attention = False

    def segment(self) -> Segment:
        return self.segments[self.current]

    def _tp_kind(self) -> tuple[bool, bool, bool]:
        """(sharded, rowwise, gathered) for the innermost Linear being run."""
        if not self.linears:
            return False, False, False
        name = self.linears[-1]
        match = lambda names: any(name == n or name.endswith("." + n) for n in names)  # noqa: E731
        return match(self.family.tp_sharded), match(self.family.tp_rowwise), match(self.family.tp_gathered)

    def attention(self, q, k, v, out) -> None:
        from torch.utils.flop_counter import sdpa_flop_count

        b, h, sq, d = q.shape
        kv = k.shape
        if kv[1] != h:  # grouped KV heads: the kernel broadcasts them
            kv = (kv[0], h, kv[2], kv[3])
        flops = sdpa_flop_count(tuple(q.shape), kv, (kv[0], h, kv[2], v.shape[-1]))
        seg = self.segment()
        seg.flops["attention"] += flops
        seg.bytes["attention"] += _nbytes([q, k, v, out])
        seg.divides["both"] += flops  # CP splits the queries, TP the heads
        seg.ulysses_bytes += _nbytes([q, k, v, out])
        seg.ring_bytes += _nbytes([k, v])

    def op(self, func, args, kwargs, out) -> None:
        import torch
        from torch.utils.flop_counter import flop_registry

        if self.in_attention:
            return
        packet = func.overloadpacket
        seg = self.segment()
        if packet in flop_registry:
            flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
            seg.flops["gemm"] += flops
            seg.bytes["gemm"] += _nbytes(list(args)) + _nbytes(out)
            rows = _gemm_rows(packet, args)
            per_token = rows > self.batch
            sharded, _, _ = self._tp_kind()
            seg.divides[{(True, True): "both", (True, False): "cp", (False, True): "tp",
                         (False, False): "none"}[(per_token, sharded)]] += flops
            return
        if func.is_view or packet in _METADATA_OPS:
            return
        seg.bytes["other"] += _nbytes([a for a in args if isinstance(a, (torch.Tensor, list, tuple))]) + _nbytes(out)

    def linear_output(self, output) -> None:
        _, rowwise, gathered = self._tp_kind()
        if rowwise:
            self.segment().tp_reduce_bytes += _nbytes(output)
        elif gathered:
            self.segment().tp_gather_bytes += _nbytes(output)


def _gemm_rows(packet, args) -> int:
    """Rows (M) of a matmul: tokens for per-token layers, the batch for per-sample ones (timestep, modulation)."""
    import torch

    aten = torch.ops.aten
    if packet in (aten.addmm, aten.baddbmm):
        a = args[1]
    else:
        a = args[0]
    if not isinstance(a, torch.Tensor) or a.dim() < 2:
        return 0
    if packet in (aten.convolution, aten._convolution, aten.conv2d, aten.conv3d):
        return math.prod(a.shape[2:]) * a.shape[0]
    return math.prod(a.shape[:-1])


def _metadata_ops():
    import torch

    aten = torch.ops.aten
    return {aten._unsafe_view, aten.detach, aten.lift_fresh, aten.alias, aten.empty, aten.empty_like,
            aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.sym_size, aten.sym_stride,
            aten.sym_numel, aten.is_same_size}


_METADATA_OPS: set = set()


@contextlib.contextmanager
def _counting(counter: _Counter, model):
    """Hooks and modes that feed `counter` during a forward of `model`."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from ditgate.core.components import block_lists

    global _METADATA_OPS
    _METADATA_OPS = _METADATA_OPS or _metadata_ops()

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            counter.op(func, args, kwargs, out)
            return out

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention and not counter.in_attention:
                counter.in_attention = True
                try:
                    out = func(*args, **kwargs)
                finally:
                    counter.in_attention = False
                q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")])[:3]
                counter.attention(q, k, v, out)
                return out
            return func(*args, **kwargs)

    handles = []
    for list_name, blocks in block_lists(model).items():
        counter.segments.update({f"{list_name}.{i}": Segment(f"{list_name}.{i}") for i in range(len(blocks))})
        for i, block in enumerate(blocks):
            key = f"{list_name}.{i}"
            handles.append(block.register_forward_pre_hook(lambda m, a, key=key: setattr(counter, "current", key)))
            handles.append(block.register_forward_hook(lambda m, a, o: setattr(counter, "current", "outside")))
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_pre_hook(lambda m, a, name=name: counter.linears.append(name)))

            def done(m, a, o):
                counter.linear_output(o)
                counter.linears.pop()

            handles.append(module.register_forward_hook(done))
    try:
        with Functions(), Dispatch():
            yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _quiet():
    """diffusers warns about dtype casts of a meta model; nothing in them concerns a count."""
    logger = logging.getLogger("diffusers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_meta(config: dict, dtype: str = "bfloat16"):
    """The transformer of `config` on the meta device: real module structure, no weights, no memory."""
    import diffusers
    import torch

    from ditgate.core.loader import torch_dtype

    class_name = config.get("_class_name")
    cls = getattr(diffusers, str(class_name), None)
    if cls is None:
        raise FlopsError(f"diffusers {diffusers.__version__} has no transformer class {class_name!r}")
    with _quiet(), torch.device("meta"):
        model = cls.from_config(config).to(torch_dtype(dtype)).eval()
    return model


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
    if family.video and frames is None:
        frames = src.defaults.get("num_frames")
    if text_len is None:
        text_len = src.defaults.get("max_sequence_length") or family.text_len
    geometry = family.geometry(src.transformer, src.vae, height, width, frames, text_len)
    meta = build_meta(src.transformer, dtype)
    counter = _Counter(family)
    with _counting(counter, meta), torch.no_grad():
        meta(**family.inputs(src.transformer, geometry, meta.dtype), return_dict=False)
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
