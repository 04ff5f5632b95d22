"""Counting FLOPs and bytes of one transformer forward on the meta device: every GEMM and attention call, per block segment."""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any
from ditgate.inspect.flops.models import Family, FlopsError

KINDS = ("attention", "gemm", "other")


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


_METADATA_OPS: set = set()


def _metadata_ops():
    import torch

    aten = torch.ops.aten
    return {aten._unsafe_view, aten.detach, aten.lift_fresh, aten.alias, aten.empty, aten.empty_like,
            aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.sym_size, aten.sym_stride,
            aten.sym_numel, aten.is_same_size}


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

    from ditgate.core.loader import torch_dtype
    from ditgate.twin.meta import DIFFUSERS, on_meta

    class_name = config.get("_class_name")
    cls = getattr(diffusers, str(class_name), None)
    if cls is None:
        raise FlopsError(f"diffusers {diffusers.__version__} has no transformer class {class_name!r}")
    with _quiet():  # a config that lies (10**9 layers, a negative width) is refused, not built for ever
        model = on_meta(cls, DIFFUSERS, config, f"{class_name} config")
    return model.to(torch_dtype(dtype)).eval()
