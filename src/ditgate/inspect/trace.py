"""Watch what the blocks do with their tensors during one pipeline run, to find traits by behaviour, not by name.

`Trace` runs next to `ditgate.inspect.observe.Probe` (same pipeline call). During the first call of each transformer
it follows every tensor a Linear of block 0 of each block list produces through the torch functions applied to it
(a `TorchFunctionMode`), and records:

- Linear outputs chunked on their feature dimension (`chunk`, `split`, `unbind`) and whether one piece goes through
  an activation and meets the other (a fused gated MLP) or not (chunked modulation);
- for every such Linear, whether its input comes from another Linear of the block (a down projection) or not;
- sorts and top-k over a dimension as long as the block's sequence (routing that depends on the whole sequence);
- norms called inside attention modules, with the width they normalise (one head, or every head);
- how often each module outside the block lists runs in one transformer call, and the transformer's output type.

Over every transformer call of the first denoising step it records, per attention module group, the shape of the
mask reaching the kernel and its padding share (masked entries / all entries), per sample of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ditgate.inspect.observe import HookedRecorder, block_lists, is_attention_module
from ditgate.inspect.variants import variants

_CHUNKS = {torch.Tensor.chunk, torch.chunk, torch.Tensor.split, torch.split, torch.Tensor.unbind, torch.unbind,
           torch.Tensor.tensor_split, torch.tensor_split}
_ACTIVATIONS = {torch.nn.functional.silu, torch.nn.functional.gelu, torch.nn.functional.relu, torch.sigmoid,
                torch.Tensor.sigmoid, torch.nn.functional.sigmoid, torch.tanh, torch.Tensor.tanh,
                torch.nn.functional.mish, torch.nn.functional.relu6}
_SORTS = {torch.topk: "topk", torch.Tensor.topk: "topk", torch.sort: "sort", torch.Tensor.sort: "sort",
          torch.argsort: "argsort", torch.Tensor.argsort: "argsort", torch.kthvalue: "kthvalue",
          torch.Tensor.kthvalue: "kthvalue"}
_SDPA = torch.nn.functional.scaled_dot_product_attention
_ADDS = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__iadd__,
         torch.Tensor.add_}


@dataclass
class LinearUse:
    """What happened to one Linear's output (path relative to the transformer, block index as `*`)."""

    layer: str
    in_features: int
    out_features: int
    chunks: int | None = None  # chunked on the feature dimension into this many pieces
    gated: bool = False  # a piece went through an activation and met another piece
    input_from: str | None = None  # the Linear of the same block whose output this one reads
    inputs_from: list[str] = field(default_factory=list)  # every such Linear (an MLP's gate and up projections)


@dataclass
class MaskCall:
    call: int  # transformer call number (1-based) within the run
    shape: list[int]
    padding_share: float  # masked entries / all entries
    per_sample: list[float]
    first_masked_key: int | None = None  # the first key position some query cannot see (where padding starts)


@dataclass
class TraceRecord:
    name: str
    linears: dict[str, LinearUse] = field(default_factory=dict)
    sequence_sorts: list[str] = field(default_factory=list)  # "<module>: topk over dim 2 (64 = the sequence)"
    block_sorts: list[dict[str, Any]] = field(default_factory=list)  # every sort in a block: module, op, dim, shape
    attention_norms: dict[str, str] = field(default_factory=dict)  # norm path -> "per head" | "across heads"
    repeated_modules: dict[str, int] = field(default_factory=dict)  # module path -> calls in one forward (> 1)
    output_type: str | None = None
    long_skips: list[str] = field(default_factory=list)  # "add of block 0's input after `<list>.<i>`"
    outside_calls: list[str] = field(default_factory=list)  # block sub-modules run outside their block's forward
    masks: dict[str, list[MaskCall]] = field(default_factory=dict)  # attention group -> masks of the first step
    calls: list[int] = field(default_factory=list)  # pipeline-wide call numbers of this transformer


def padding_share(mask: torch.Tensor) -> tuple[float, list[float]] | None:
    """Share of masked entries of a boolean (False) or additive (large negative) mask, overall and per sample."""
    if mask.dtype == torch.bool:
        masked = ~mask
    elif mask.is_floating_point():
        masked = mask < -1e4
    else:
        return None
    flat = masked.reshape(masked.shape[0], -1).float() if masked.ndim > 1 else masked[None].float()
    return float(flat.mean()), [round(float(v), 4) for v in flat.mean(dim=1)]


def _dim(func, args, kwargs) -> int:
    """The `dim` of a sort-like call: topk(x, k, dim) and kthvalue(x, k, dim); sort(x, dim) and argsort(x, dim)."""
    at = 2 if _SORTS[func] in ("topk", "kthvalue") else 1
    value = kwargs.get("dim", args[at] if len(args) > at else -1)
    return value if isinstance(value, int) else -1


class _Mode(TorchFunctionMode):
    def __init__(self, trace: "Trace"):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.trace._on_function(func, args, kwargs, out)
        return out


class Trace(HookedRecorder):
    """Context manager over `{name: transformer}`, used together with `Probe` for one pipeline call."""

    def __init__(self, transformers: dict[str, torch.nn.Module], probe=None):
        self.records = {name: TraceRecord(name) for name in transformers}
        self._modules = transformers
        self._probe = probe  # its step_calls tell when the first denoising step ended
        self._handles: list[Any] = []
        self._mode = _Mode(self)
        self._calls = 0  # transformer calls of the run so far
        self._active: list[str] = []
        self._first: str | None = None  # transformer in its first call, where tensors are followed
        # id -> (Linear group, is a piece, tensor, every Linear group whose output it carries)
        self._taint: dict[int, tuple[str, bool, torch.Tensor, frozenset]] = {}
        self._seq: list[int] = []  # sequence length of the block being run
        self._modules_stack: list[str] = []
        self._attention: list[str] = []
        self._widths: list[set[int]] = []  # output widths of the Linears of each attention module running
        self._counts: dict[str, int] = {}
        self._entry: torch.Tensor | None = None  # hidden states entering the first block of the first call
        self._inside = 0  # blocks currently running
        self._last_block = ""  # the last block that ran in the first call
        self._blocks: set[int] = set()  # ids of the blocks currently running

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._taint.clear()

    def _in_first_step(self) -> bool:
        return not (self._probe is not None and self._probe.step_calls) and self._calls <= 8

    # -- installation -----------------------------------------------------------------------------------------------
    def _install(self, name: str, transformer: torch.nn.Module) -> None:
        record = self.records[name]
        lists = block_lists(transformer)

        def enter(module, args, kwargs):
            self._calls += 1
            record.calls.append(self._calls)
            self._active.append(name)
            if len(record.calls) == 1:
                self._first, self._counts, self._entry = name, {}, None

        def leave(module, args, kwargs, output):
            self._active.pop()
            if self._first == name:
                record.output_type = type(output).__name__
                record.repeated_modules = {p: n for p, n in self._counts.items() if n > 1}
                self._first = None
                self._taint.clear()
                self._entry = None

        self._hook(transformer, enter, leave)
        # the first block of each structure a list holds (block 0, and e.g. the first MoE block after dense ones)
        followed = {list_name: {str(g[0]) for g in variants(blocks)} for list_name, blocks in lists.items()}
        first_blocks = {id(blocks[int(i)]) for list_name, blocks in lists.items() for i in followed[list_name]}
        for path, module in transformer.named_modules():
            if not path:
                continue
            top = path.split(".")[0]
            inside = top in lists
            if not inside:
                self._hook(module, pre=self._counter(name, path))
            if id(module) in first_blocks:
                self._hook(module, *self._block_hooks(name))
            parts = path.split(".")
            if inside and len(parts) == 2 and parts[1].isdigit():
                self._hook(module, *self._any_block_hooks(name, path))
            elif inside and len(parts) > 2:
                self._hook(module, pre=self._outside_hook(record, ".".join(parts[:2]), module_path=path,
                                                          block=transformer.get_submodule(".".join(parts[:2]))))
            if is_attention_module(module):
                group = _group(path, lists)
                self._hook(module, *self._attention_hooks(group, module))
            block0 = inside and len(parts) >= 2 and parts[1] in followed[top]
            if block0 and isinstance(module, torch.nn.Linear):
                self._hook(module, *self._linear_hooks(record, _group(path, lists), module))
            if block0 and "norm" in type(module).__name__.lower():
                self._hook(module, pre=self._norm_hook(record, _group(path, lists)))
            if block0:
                self._hook(module, *self._stack_hooks(_group(path, lists)))

    def _counter(self, name: str, path: str):
        def pre(module, args, kwargs):
            if self._first == name and self._active[-1:] == [name]:
                self._counts[path] = self._counts.get(path, 0) + 1
        return pre

    def _block_hooks(self, name: str):
        def pre(module, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            self._seq.append(int(hidden.shape[1]) if isinstance(hidden, torch.Tensor) and hidden.ndim >= 3 else 0)

        def post(module, args, kwargs, output):
            if self._seq:
                self._seq.pop()
            self._taint.clear()  # block 0 of a list is over: nothing later is followed
        return pre, post

    def _any_block_hooks(self, name: str, path: str):
        def pre(module, args, kwargs):
            self._blocks.add(id(module))
            self._inside += 1
            if self._first == name and self._entry is None:
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                self._entry = hidden if isinstance(hidden, torch.Tensor) else None

        def post(module, args, kwargs, output):
            self._blocks.discard(id(module))
            self._inside -= 1
            self._last_block = path
        return pre, post

    def _outside_hook(self, record: TraceRecord, block_path: str, module_path: str, block):
        def pre(module, args, kwargs):
            if self._first == record.name and id(block) not in self._blocks:
                note = f"{module_path} (called while {block_path} is not running)"
                if note not in record.outside_calls:
                    record.outside_calls.append(note)
        return pre

    def _stack_hooks(self, group: str):
        def pre(module, args, kwargs):
            self._modules_stack.append(group)

        def post(module, args, kwargs, output):
            if self._modules_stack:
                self._modules_stack.pop()
        return pre, post

    def _attention_hooks(self, group: str, attention: torch.nn.Module):
        widths = {m.out_features for m in attention.modules() if isinstance(m, torch.nn.Linear)}

        def pre(module, args, kwargs):
            self._attention.append(group)
            self._widths.append(widths)

        def post(module, args, kwargs, output):
            if self._attention:
                self._attention.pop()
                self._widths.pop()
        return pre, post

    def _linear_hooks(self, record: TraceRecord, group: str, linear: torch.nn.Linear):
        block = group.split(".")[0]

        def pre(module, args, kwargs):
            if self._first != record.name or not args or not isinstance(args[0], torch.Tensor):
                return
            use = record.linears.setdefault(group, LinearUse(group, linear.in_features, linear.out_features))
            source = self._taint.get(id(args[0]))
            if source is not None and source[0].split(".")[0] == block and use.input_from is None:
                use.input_from = source[0]
            for layer in sorted(source[3]) if source is not None else ():
                if layer.split(".")[0] == block and layer not in use.inputs_from:
                    use.inputs_from.append(layer)

        def post(module, args, kwargs, output):
            if self._first == record.name and isinstance(output, torch.Tensor):
                self._taint[id(output)] = (group, False, output, frozenset([group]))
        return pre, post

    def _norm_hook(self, record: TraceRecord, group: str):
        def pre(module, args, kwargs):
            if self._first != record.name or not self._attention or not args:
                return
            x = args[0]
            if isinstance(x, torch.Tensor) and x.ndim >= 2:
                # over the last dim only: [.., heads * head_dim] (a projection's whole output width) spans all heads;
                # [.., heads, head_dim] (batched, or a packed [tokens, heads, head_dim]) is one head
                across = x.ndim <= 3 and x.shape[-1] in self._widths[-1]
                record.attention_norms.setdefault(group, "across heads" if across else "per head")
        return pre

    # -- tensors ----------------------------------------------------------------------------------------------------
    def _on_function(self, func, args, kwargs, out) -> None:
        if func is _SDPA:
            self._on_sdpa(args, kwargs)
            return
        if self._first is None:
            return
        record = self.records[self._first]
        if func in _ADDS and self._entry is not None and not self._inside and self._last_block and any(
                a is self._entry for a in args):
            note = f"the first block's input is added to the stream after `{self._last_block}`"
            if note not in record.long_skips:
                record.long_skips.append(note)
        if func in _SORTS and self._seq and self._seq[-1] > 1 and args and isinstance(args[0], torch.Tensor):
            dim = _dim(func, args, kwargs)
            x = args[0]
            where = self._modules_stack[-1] if self._modules_stack else "a block"
            over = bool(x.ndim) and x.shape[dim] == self._seq[-1]
            entry = {"module": where, "op": _SORTS[func], "dim": dim % max(x.ndim, 1), "shape": list(x.shape),
                     "over_sequence": over}
            if entry not in record.block_sorts:
                record.block_sorts.append(entry)
            if over:
                note = (f"{where}: {_SORTS[func]} over dim {dim % x.ndim} of {list(x.shape)} "
                        f"({x.shape[dim]} = the sequence)")
                if note not in record.sequence_sorts:
                    record.sequence_sorts.append(note)
        tainted = [self._taint[id(a)] for a in (*args, *kwargs.values())
                   if isinstance(a, torch.Tensor) and id(a) in self._taint]
        if not tainted:
            return
        # a piece of a chunked output (modulation: shift, scale, gate) does not make what it modulates its own
        source = next((t for t in tainted if not t[1]), None) or tainted[0]
        layer, piece = source[0], source[1]
        use = record.linears.get(layer)
        if piece and func not in _ACTIVATIONS and not (use is not None and use.gated):
            return
        if func in _CHUNKS and use is not None and not piece and args and isinstance(args[0], torch.Tensor):
            dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
            if isinstance(dim, int) and dim % args[0].ndim == args[0].ndim - 1 and isinstance(out, (tuple, list)):
                use.chunks = len(out)
                for t in out:
                    self._taint[id(t)] = (layer, True, t, frozenset([layer]))
                return
        if func in _ACTIVATIONS and piece and use is not None and (use.chunks or 0) == 2:
            use.gated = True
        carried = frozenset().union(*(t[3] for t in tainted if not t[1] or t is source))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and id(t) not in self._taint:
                self._taint[id(t)] = (layer, False, t, carried)

    def _on_sdpa(self, args, kwargs) -> None:
        if not self._active or not self._in_first_step():
            return
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if not isinstance(mask, torch.Tensor):
            return
        share = padding_share(mask)
        if share is None:
            return
        group = self._attention[-1] if self._attention else "(outside attention modules)"
        calls = self.records[self._active[-1]].masks.setdefault(group, [])
        if not any(c.call == self._calls for c in calls):
            masked = (~mask if mask.dtype == torch.bool else mask < -1e4).reshape(-1, mask.shape[-1]).any(dim=0)
            first = int(masked.nonzero()[0, 0]) if bool(masked.any()) else None
            calls.append(MaskCall(self._calls, list(mask.shape), round(share[0], 4), share[1], first))


def _group(path: str, lists: dict) -> str:
    parts = path.split(".")
    if len(parts) > 1 and parts[0] in lists and parts[1].isdigit():
        parts[1] = "*"
    return ".".join(parts)
