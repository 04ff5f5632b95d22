"""Observe one pipeline run: transformer calls, block inputs and outputs, attention calls.

`Probe` installs forward hooks on every transformer of a pipeline, on its direct children, on every block of its
block ModuleLists and on its attention modules, plus a `TorchFunctionMode` that sees every
`scaled_dot_product_attention` call (however the processor reaches it). It keeps references only where a
comparison needs them (block 0's inputs and outputs, the previous block's outputs) and only during the first call of
each transformer; later calls are just counted. Nothing here decides anything: `ditgate.inspect.anatomy` reads the record.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def is_block_list(value: Any) -> bool:
    """A ModuleList of >= 1 modules of one class that is not a torch.nn building block (Linear, Conv, ...)."""
    if not isinstance(value, torch.nn.ModuleList) or len(value) == 0 or len({type(m) for m in value}) != 1:
        return False
    return not type(value[0]).__module__.startswith("torch.nn")


def block_lists(transformer: torch.nn.Module) -> dict[str, torch.nn.ModuleList]:
    """The block ModuleLists directly on `transformer`, in definition order."""
    return {name: child for name, child in transformer.named_children() if is_block_list(child)}


def is_attention_module(module: torch.nn.Module) -> bool:
    """A diffusers attention module (it owns a processor) or a module whose class is named like one."""
    if hasattr(module, "processor") and not isinstance(module, torch.nn.ModuleList):
        return True
    name = type(module).__name__
    return name.endswith("Attention") and any(isinstance(c, torch.nn.Linear) for c in module.children())


def tensor_summary(value: Any) -> str:
    """A short, JSON-friendly description: 'tensor[1, 1024, 64] float32', 'tuple(2 x tensor[...])', 'None'."""
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (tuple, list)):
        inner = [tensor_summary(v) for v in value]
        if inner and len(set(inner)) == 1:
            return f"{type(value).__name__}({len(inner)} x {inner[0]})"
        return f"{type(value).__name__}({', '.join(inner)})"
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={tensor_summary(v)}" for k, v in value.items()) + ")"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__name__


def same_value(a: Any, b: Any) -> str | None:
    """'same' when `a is b`, 'equal' when equal in value (tensors: same shape and torch.equal), else None."""
    if a is b:
        return "same"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b):
            return "equal"
        return None
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b)):
            return "equal"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a):
            return "equal"
        return None
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return None
    try:
        return "equal" if a == b else None
    except Exception:  # noqa: BLE001 - objects whose == is not a plain bool
        return None


def carries(output: Any, argument: Any) -> int | None:
    """The dimension along which `argument` holds a part of `output` as it is: a whole nonzero slice (aligned at the
    start or the end; the other dimensions of equal size) equal in both (a stream the loop cut or joined), else None."""
    if not (isinstance(output, torch.Tensor) and isinstance(argument, torch.Tensor)) or output.ndim != argument.ndim \
            or output.dtype != argument.dtype or not output.numel() or not argument.numel():
        return None
    for d in range(1, output.ndim):
        m, rest = min(output.shape[d], argument.shape[d]), [i for i in range(output.ndim) if i != d]
        if [output.shape[i] for i in rest] == [argument.shape[i] for i in rest] and any(
                ((a == b).all(dim=rest) & (a != 0).any(dim=rest)).any() for a, b in (
                    (output.narrow(d, 0, m), argument.narrow(d, 0, m)),
                    (output.narrow(d, output.shape[d] - m, m), argument.narrow(d, argument.shape[d] - m, m)))):
            return d
    return None


def as_outputs(output: Any) -> tuple | None:
    """A block's return value as a tuple of elements, or None when it is neither a tensor nor a tuple/list."""
    if isinstance(output, torch.Tensor):
        return (output,)
    if isinstance(output, (tuple, list)):
        return tuple(output)
    return None


def match_flows(outputs: tuple | None, bound: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """Which argument of a call each tensor output reappears as: position -> (parameter, 'same'|'equal')."""
    flows: dict[int, tuple[str, str]] = {}
    for position, value in enumerate(outputs or ()):
        if not isinstance(value, torch.Tensor):
            continue
        for param, argument in bound.items():
            how = same_value(value, argument) if isinstance(argument, torch.Tensor) else None
            if how and (position not in flows or how == "same"):
                flows[position] = (param, how)
    return flows


@dataclass
class CallShape:
    """How a module was called: positional count, keyword names, and the arguments bound to parameter names."""

    positional: int
    keywords: list[str]
    bound: dict[str, Any]  # parameter name -> value (references; not serialised)


def bind_call(forward, args: tuple, kwargs: dict) -> CallShape:
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        for name, param in inspect.signature(forward).parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
                arguments.update(arguments.pop(name))
    except (TypeError, ValueError):
        arguments = {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
    return CallShape(len(args), list(kwargs), arguments)


@dataclass
class Transition:
    """Where each output of block i went in block i+1: output position -> (parameter name, 'same'|'equal')."""

    index: int  # the receiving block (i + 1)
    flows: dict[int, tuple[str, str]]
    changed_args: list[str]  # arguments other than the flowing ones that differ from block 0's
    from_outputs: list[str] = field(default_factory=list)  # changed arguments that are an earlier block's output
    sources: dict[str, tuple[int, int]] = field(default_factory=dict)  # such an argument -> (block, output position)
    carried: list[str] = field(default_factory=list)  # arguments holding a part of block i's output (cut, joined)


@dataclass
class ListRecord:
    """What one block list did during the first call of its transformer."""

    name: str
    order: list[int] = field(default_factory=list)  # block indices in call order
    first_call: CallShape | None = None
    first_outputs: Any = None  # block 0's raw return value
    transitions: list[Transition] = field(default_factory=list)
    _previous: tuple | None = None
    _outputs: list = field(default_factory=list)  # (block, output position, tensor) of every tensor returned


@dataclass
class SdpaCall:
    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    mask: tuple[int, ...] | None
    mask_all_true: bool | None
    is_causal: bool
    enable_gqa: bool


@dataclass
class AttentionRecord:
    """First observed call of one attention module group (e.g. `transformer_blocks.*.attn`)."""

    group: str
    cls: str
    processor: str | None
    calls: int = 0
    kwargs: dict[str, str] = field(default_factory=dict)
    mask_kwargs: list[str] = field(default_factory=list)  # mask-like arguments that were tensors
    sdpa: list[SdpaCall] = field(default_factory=list)


@dataclass
class TransformerRecord:
    name: str
    calls: int = 0
    first_call: CallShape | None = None
    events: list[str] = field(default_factory=list)  # direct children and blocks ("<list>.<i>") in call order
    child_outputs: dict[str, Any] = field(default_factory=dict)  # first output of each direct child
    lists: dict[str, ListRecord] = field(default_factory=dict)
    attention: dict[str, AttentionRecord] = field(default_factory=dict)
    sdpa_outside_modules: list[SdpaCall] = field(default_factory=list)


def _group_name(path: str, list_names: set[str]) -> str:
    parts = path.split(".")
    if len(parts) > 1 and parts[0] in list_names and parts[1].isdigit():
        parts[1] = "*"
    return ".".join(parts)


def _mask_all_true(mask: torch.Tensor) -> bool | None:
    if mask.dtype == torch.bool:
        return bool(mask.all())
    if mask.is_floating_point():  # additive mask: 0 everywhere means no masking
        return bool((mask == 0).all())
    return None


class _SdpaRecorder(TorchFunctionMode):
    def __init__(self, probe: "Probe"):
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.probe._on_sdpa(dict(zip(_SDPA_PARAMS, args)) | kwargs)
        return func(*args, **kwargs)


class HookedRecorder:
    """A context manager that installs forward hooks on `self._modules` (`_install(name, module)`) and a torch
    function mode (`self._mode`) on entry, and removes both on exit."""

    _modules: dict[str, torch.nn.Module]
    _handles: list
    _mode: TorchFunctionMode

    def _install(self, name: str, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def __enter__(self):
        for name, module in self._modules.items():
            self._install(name, module)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, module, pre=None, post=None) -> None:
        if pre is not None:
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        if post is not None:
            self._handles.append(module.register_forward_hook(post, with_kwargs=True))


class Probe(HookedRecorder):
    """Context manager over `{name: transformer}`: `with Probe(transformers) as probe: pipe(...)`, then read
    `probe.transformers` (one `TransformerRecord` per name) and `probe.step_calls`."""

    def __init__(self, transformers: dict[str, torch.nn.Module]):
        self.transformers = {name: TransformerRecord(name) for name in transformers}
        self._modules = transformers
        self._handles: list[Any] = []
        self._active: list[str] = []  # transformer names currently in forward (normally 0 or 1)
        self._attention_stack: list[AttentionRecord] = []
        self._mode = _SdpaRecorder(self)
        self.step_calls: list[int] = []  # transformer calls counted at each step end (when the pipeline reports)

    # -- installation ---------------------------------------------------------------------------------------
    def _install(self, name: str, transformer: torch.nn.Module) -> None:
        record = self.transformers[name]
        lists = block_lists(transformer)

        def enter(module, args, kwargs):
            record.calls += 1
            self._active.append(name)
            if record.calls == 1:
                record.first_call = bind_call(module.forward, args, kwargs)

        def leave(module, args, kwargs, output):
            self._active.pop()

        self._hook(transformer, enter, leave)

        for child_name, child in transformer.named_children():
            if child_name in lists:
                continue
            self._hook(child, post=self._child_hook(record, child_name))

        for list_name, blocks in lists.items():
            list_record = record.lists[list_name] = ListRecord(list_name)
            for index, block in enumerate(blocks):
                pre, post = self._block_hooks(record, list_record, index, block)
                self._hook(block, pre, post)

        names = set(lists)
        block_classes = tuple(type(blocks[0]) for blocks in lists.values())
        for path, module in transformer.named_modules():
            if path and is_attention_module(module) and not isinstance(module, block_classes):
                pre, post = self._attention_hooks(record, _group_name(path, names), module)
                self._hook(module, pre, post)

    def _first_call(self, record: TransformerRecord) -> bool:
        return record.calls == 1 and self._active and self._active[-1] == record.name

    def _child_hook(self, record: TransformerRecord, child_name: str):
        def post(module, args, kwargs, output):
            if self._first_call(record):
                record.events.append(child_name)
                record.child_outputs.setdefault(child_name, output)
        return post

    def _block_hooks(self, record: TransformerRecord, list_record: ListRecord, index: int, block):
        def pre(module, args, kwargs):
            if not self._first_call(record):
                return
            record.events.append(f"{list_record.name}.{index}")
            list_record.order.append(index)
            call = bind_call(module.forward, args, kwargs)
            if list_record.first_call is None:
                list_record.first_call = call
            elif list_record._previous is not None:
                list_record.transitions.append(self._transition(list_record, index, call))

        def post(module, args, kwargs, output):
            if not self._first_call(record):
                return
            if list_record.first_outputs is None:
                list_record.first_outputs = output
            list_record._previous = as_outputs(output)
            list_record._outputs += [(index, position, t) for position, t in enumerate(list_record._previous or ())
                                     if isinstance(t, torch.Tensor) and t.numel()]

        return pre, post

    @staticmethod
    def _transition(list_record: ListRecord, index: int, call: CallShape) -> Transition:
        flows = match_flows(list_record._previous, call.bound)
        flowing = {param for param, _ in flows.values()}
        first = list_record.first_call.bound
        changed = [param for param, argument in call.bound.items()
                   if param not in flowing and (param not in first or same_value(first[param], argument) is None)]
        earlier = {}  # the first block (in call order) that returned each tensor
        for block, position, tensor in list_record._outputs:
            earlier.setdefault((tensor.data_ptr(), tuple(tensor.shape)), (block, position))
        sources = {p: earlier[(a.data_ptr(), tuple(a.shape))] for p in changed if isinstance(a := call.bound[p],
                   torch.Tensor) and a.numel() and (a.data_ptr(), tuple(a.shape)) in earlier}
        carried = [p for p, a in call.bound.items() if p not in flowing
                   and any(carries(o, a) is not None for o in list_record._previous or ())]
        return Transition(index, flows, changed, list(sources), sources, carried)

    def _attention_hooks(self, record: TransformerRecord, group: str, module):
        def pre(mod, args, kwargs):
            if not (self._active and self._active[-1] == record.name):
                return
            attention = record.attention.get(group)
            if attention is None:
                processor = getattr(mod, "processor", None)
                attention = record.attention[group] = AttentionRecord(
                    group, type(mod).__name__, type(processor).__name__ if processor is not None else None)
            attention.calls += 1
            call = bind_call(mod.forward, args, kwargs)
            if attention.calls == 1:
                attention.kwargs = {k: tensor_summary(v) for k, v in call.bound.items()}
            for key, value in call.bound.items():
                if "mask" in key and isinstance(value, torch.Tensor) and key not in attention.mask_kwargs:
                    attention.mask_kwargs.append(key)
            self._attention_stack.append(attention)

        def post(mod, args, kwargs, output):
            if self._attention_stack and self._attention_stack[-1].group == group:
                self._attention_stack.pop()

        return pre, post

    # -- observations -----------------------------------------------------------------------------------------
    def _on_sdpa(self, bound: dict[str, Any]) -> None:
        if not self._active:
            return
        mask = bound.get("attn_mask")
        call = SdpaCall(
            query=tuple(bound["query"].shape), key=tuple(bound["key"].shape), value=tuple(bound["value"].shape),
            mask=tuple(mask.shape) if isinstance(mask, torch.Tensor) else None,
            mask_all_true=_mask_all_true(mask) if isinstance(mask, torch.Tensor) else None,
            is_causal=bool(bound.get("is_causal", False)), enable_gqa=bool(bound.get("enable_gqa", False)))
        record = self.transformers[self._active[-1]]
        if self._attention_stack:
            target = self._attention_stack[-1].sdpa
            if len(target) < 4:  # the first few calls are enough to see shapes and masks
                target.append(call)
        elif len(record.sdpa_outside_modules) < 4:
            record.sdpa_outside_modules.append(call)

    def step_end_callback(self, pipe, step, timestep, callback_kwargs):
        """`callback_on_step_end` for pipelines that take one: counts transformer calls at each step end."""
        self.step_calls.append(sum(r.calls for r in self.transformers.values()))
        return callback_kwargs
