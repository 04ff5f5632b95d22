"""`ditgate inspect`: the anatomy of a diffusion pipeline, as the GATE CHECK needs it, and a draft plan.

`inspect_model(model, ...)` loads a pipeline (a folder or `zoo:NAME`), runs it once for a few steps with hooks
(`ditgate.inspect.observe`), reads cache-dit's registries (`ditgate.inspect.support`) and returns an `Anatomy`.
`analyse(pipe, call)` does the same for a pipeline object already in memory.

JSON keys (`Anatomy.to_dict()`, printed by `ditgate inspect --json`):

- `model`, `pipeline` {name, cls, module, source_file}, `call` (the pipeline call that was run; tensors left out),
  `steps` (denoising steps of that run).
- `components`: {transformers, text_encoders, vaes, others}: lists of {name, cls, module, source_file, parameters}.
- `block_lists`: one per block ModuleList directly on a transformer: `transformer`, `attribute`, `length`,
  `block_class`, `block_module`, `source_file`, `signature` [{name, kind, has_default}], `returns` (annotation),
  `called` (seen during the run), `call` {positional, keyword, inputs {param: summary}} (block 0, first call),
  `outputs` (observed roles in return order: "hidden_states" / "encoder_hidden_states" / "other"),
  `output_shapes`, `role_evidence` ("flow" = the output reappears as the next block's input, "shape",
  "similarity"), `encoder_param` (the input whose update is returned, if any), `pattern` ("Pattern_0".."Pattern_5"
  or null), `pattern_reason`, `check_forward_pattern` (whether cache-dit's static name check passes with that
  pattern), `patch_functor_needed`, `loop_findings` (extra work seen between block calls).
- `between_lists`: findings about what happens between two block lists of one transformer.
- `calls_per_step` (transformer calls per denoising step, all transformers together), `calls_by_step`,
  `transformer_calls` {transformer: calls in the run}, `has_separate_cfg` (true when a step calls the transformer
  twice), `batch` (batch of the hidden states entering the blocks).
- `attention`: `heads`, `kv_heads`, `head_dim`, `gqa`, `mask` (a mask reaches attention), `mask_sources`,
  `mask_all_true`, `fused_qkv` (Linear layers holding fused projections), `non_pytorch_kernels`,
  `attention_backends` (processor backends that are set), `qk_norm_across_heads`, `groups` (one per attention module
  group such as `transformer_blocks.*.attn`: transformer, group, cls, processor, calls, heads, kv_heads, head_dim,
  kernel_heads, kernel_kv_heads, kernel_head_dim, q_len, kv_len, kind "self"/"joint"/"cross", mask, enable_gqa).
- `sequence`: `image_tokens` (length of the hidden states entering the first block list), `text_tokens`,
  `attention_tokens` (image + text for joint attention), `joint`, `per_token_tables` (modules called before the
  blocks whose outputs are per-token tables, e.g. RoPE), `gather_candidates` (modules after the blocks whose output
  still has the image sequence), `divisibility` {"2"|"4"|"8": {image_tokens, text_tokens, heads, kv_heads, ulysses,
  ring, tp}} (booleans; ulysses is "ok" or "ulysses-anything").
- `tp_layers`: per block class, its Linear layers with a suggested TP style.
- `cache_dit`: what cache-dit provides: `cache_dit_version`, `adapter` (registered BlockAdapter: prefix, function,
  transformers, block_lists, blocks_name, dummy_blocks_names, forward_patterns, has_separate_cfg, patch_functor,
  check_forward_pattern) or null, `adapter_error`, `cp_planners`, `tp_planners` {transformer: class or null},
  `text_encoder_planners`, `vae_planners` {component: class or null}, `cli_examples`.
- `warnings`: disagreements and risks found (e.g. a registered separate-CFG flag that contradicts the measurement).
- `plan`: the draft integration plan (Markdown).
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ditgate.inspect.observe import Probe, as_outputs, block_lists, is_attention_module, match_flows, tensor_summary
from ditgate.core.errors import PipelineRunError

RANKS = (2, 4, 8)
DEFAULT_PROMPT = "a red cube on a wooden table"
DEFAULT_NEGATIVE_PROMPT = "blurry"
KERNEL_PACKAGES = ("flash_attn", "flash_attn_interface", "triton", "apex", "xformers", "transformer_engine",
                   "liger_kernel", "sageattention", "spas_sage_attn", "nunchaku", "bitsandbytes", "deepspeed",
                   "flashinfer", "sgl_kernel", "vllm", "kernels")
H, E, OTHER = "hidden_states", "encoder_hidden_states", "other"


# -- result types -------------------------------------------------------------------------------------------------
@dataclass
class Component:
    name: str
    cls: str
    module: str
    source_file: str | None
    parameters: int | None = None


@dataclass
class Param:
    name: str
    kind: str
    has_default: bool


@dataclass
class BlockList:
    transformer: str
    attribute: str
    length: int
    block_class: str
    block_module: str
    source_file: str | None
    signature: list[Param]
    returns: str
    called: bool = False
    call: dict[str, Any] | None = None
    outputs: list[str] | None = None
    output_shapes: list[str] = field(default_factory=list)
    role_evidence: str | None = None
    encoder_param: str | None = None
    pattern: str | None = None
    pattern_reason: str = ""
    check_forward_pattern: bool | None = None
    patch_functor_needed: bool = False
    loop_findings: list[str] = field(default_factory=list)


@dataclass
class AttentionGroup:
    transformer: str
    group: str
    cls: str
    processor: str | None
    calls: int
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    kernel_heads: int | None = None
    kernel_kv_heads: int | None = None
    kernel_head_dim: int | None = None
    q_len: int | None = None
    kv_len: int | None = None
    kind: str | None = None
    mask: bool = False
    enable_gqa: bool = False


@dataclass
class Attention:
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    gqa: bool = False
    mask: bool = False
    mask_sources: list[str] = field(default_factory=list)
    mask_all_true: bool | None = None
    fused_qkv: list[str] = field(default_factory=list)
    non_pytorch_kernels: list[str] = field(default_factory=list)
    attention_backends: list[str] = field(default_factory=list)
    qk_norm_across_heads: list[str] = field(default_factory=list)
    groups: list[AttentionGroup] = field(default_factory=list)


@dataclass
class Sequence:
    image_tokens: int | None = None
    text_tokens: int | None = None
    attention_tokens: int | None = None
    joint: bool = False
    per_token_tables: list[str] = field(default_factory=list)
    gather_candidates: list[str] = field(default_factory=list)
    divisibility: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Anatomy:
    model: str
    pipeline: Component
    call: dict[str, Any]
    steps: int
    components: dict[str, list[Component]]
    block_lists: list[BlockList]
    between_lists: list[str]
    calls_per_step: float | None
    calls_by_step: list[int]
    transformer_calls: dict[str, int]
    has_separate_cfg: bool
    batch: int | None
    attention: Attention
    sequence: Sequence
    tp_layers: dict[str, list[dict[str, Any]]]
    cache_dit: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    plan: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- components ---------------------------------------------------------------------------------------------------
def source_file(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj if inspect.isclass(obj) else type(obj))
    except (TypeError, OSError):
        return None


def _component(name: str, obj: Any) -> Component:
    import torch

    params = sum(p.numel() for p in obj.parameters()) if isinstance(obj, torch.nn.Module) else None
    cls = type(obj)
    return Component(name, cls.__name__, cls.__module__, source_file(cls), params)


def classify_components(pipe) -> dict[str, dict[str, Any]]:
    """Pipeline components by role: transformers, text_encoders, vaes, others (other modules and the scheduler)."""
    import torch

    groups: dict[str, dict[str, Any]] = {"transformers": {}, "text_encoders": {}, "vaes": {}, "others": {}}
    for name, obj in getattr(pipe, "components", {}).items():
        if obj is None or not (isinstance(obj, torch.nn.Module) or name == "scheduler"):
            continue
        cls_name = type(obj).__name__
        if name.startswith("text_encoder") or type(obj).__module__.startswith("transformers."):
            groups["text_encoders"][name] = obj
        elif name.startswith("vae") or cls_name.startswith("Autoencoder"):
            groups["vaes"][name] = obj
        elif isinstance(obj, torch.nn.Module) and (name.startswith("transformer") or
                                                   ("Transformer" in cls_name and block_lists(obj))):
            groups["transformers"][name] = obj
        else:
            groups["others"][name] = obj
    return groups


# -- the pipeline call --------------------------------------------------------------------------------------------
def build_call(pipe, defaults: dict[str, Any] | None, *, height: int | None = None, width: int | None = None,
               frames: int | None = None, steps: int = 2) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of the probe run and the names dropped because `__call__` does not take them."""
    call = dict(defaults) if defaults else {"prompt": DEFAULT_PROMPT, "negative_prompt": DEFAULT_NEGATIVE_PROMPT}
    for key, value in (("height", height), ("width", width), ("num_frames", frames)):
        if value is not None:
            call[key] = value
    call["num_inference_steps"] = steps
    params = inspect.signature(type(pipe).__call__).parameters
    if "output_type" in params:
        call["output_type"] = "latent"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return call, []
    dropped = [k for k in call if k not in params]
    return {k: v for k, v in call.items() if k in params}, dropped


def run_probe(pipe, transformers: dict[str, Any], call: dict[str, Any]) -> Probe:
    import torch

    params = inspect.signature(type(pipe).__call__).parameters
    probe = Probe(transformers)
    kwargs = dict(call)
    if "generator" in params:
        kwargs["generator"] = torch.Generator("cpu").manual_seed(0)
    if "callback_on_step_end" in params:
        kwargs["callback_on_step_end"] = probe.step_end_callback
    try:
        with torch.no_grad(), probe:
            pipe(**kwargs)
    except Exception as exc:  # noqa: BLE001 - report any failure of the user's pipeline as a usage problem
        raise PipelineRunError(f"running {type(pipe).__name__} with {call} failed: {type(exc).__name__}: {exc}. "
                               "Pass --height/--width/--frames that the model accepts, or --pipeline.") from exc
    return probe


# -- block lists and ForwardPatterns ------------------------------------------------------------------------------
def _signature(forward) -> list[Param]:
    return [Param(p.name, p.kind.name.lower(), p.default is not inspect.Parameter.empty)
            for p in inspect.signature(forward).parameters.values()]


def _positional(params: list[Param]) -> list[str]:
    return [p.name for p in params if p.kind in ("positional_only", "positional_or_keyword")]


def _cosine(a, b) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    return float((a @ b) / (a.norm() * b.norm() + 1e-30))


def output_roles(record, params: list[Param]) -> tuple[list[str] | None, str | None, str | None]:
    """Roles of block 0's outputs, the evidence used, and the input whose update is returned (if any)."""
    import torch

    outputs = as_outputs(record.first_outputs)
    if outputs is None:
        return None, None, None
    first = _positional(params)[:1]
    h_param = first[0] if first else None
    bound = record.first_call.bound
    roles: list[str | None] = [None] * len(outputs)
    encoder_param, evidence = None, None
    if record.transitions and record.transitions[0].index == record.order[0] + 1:
        for position, (param, _) in record.transitions[0].flows.items():
            roles[position] = H if param == h_param else E
            if param != h_param:
                encoder_param = param
            evidence = "flow"
    for position, out in enumerate(outputs):
        if roles[position] is not None:
            continue
        if not isinstance(out, torch.Tensor):
            roles[position] = OTHER
            continue
        same_shape = [p for p, v in bound.items() if isinstance(v, torch.Tensor) and v.shape == out.shape]
        taken = {encoder_param} if encoder_param else set()
        if H in roles:
            taken.add(h_param)
        candidates = [p for p in same_shape if p not in taken]
        if len(candidates) == 1:
            param = candidates[0]
            evidence = evidence or "shape"
        elif candidates:
            param = max(candidates, key=lambda p: _cosine(out, bound[p]))
            evidence = "similarity"
        else:
            roles[position] = OTHER
            continue
        roles[position] = H if param == h_param else E
        if param != h_param:
            encoder_param = param
    return [r or OTHER for r in roles], evidence, encoder_param


def _rebinds(pattern, params: list[Param], call_positional: int, call_keywords: list[str],
             block_forward) -> str | None:
    """None when cache-dit's cached blocks would pass this call on to the block unchanged; else why not.

    cache-dit's cached blocks are called like the block was, bind the call to
    `forward(hidden_states, encoder_hidden_states, *args, **kwargs)` (Pattern_0..2) or
    `forward(hidden_states, *args, **kwargs)` (Pattern_3..5), then call every block as
    `block(hidden_states[, encoder_hidden_states], *args, **kwargs)`.
    """
    P = inspect.Parameter
    names = ["hidden_states"] + ([] if pattern.Forward_H_only else ["encoder_hidden_states"])
    cached = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names] +
                               [P("args", P.VAR_POSITIONAL), P("kwargs", P.VAR_KEYWORD)])
    positional = _positional(params)[:call_positional]
    tokens_args = tuple(positional)
    tokens_kwargs = {k: k for k in call_keywords}
    try:
        outer = cached.bind(*tokens_args, **tokens_kwargs)
    except TypeError as exc:
        return f"the cached blocks cannot take the loop's call ({exc})"
    passed = [outer.arguments[n] for n in names] + list(outer.arguments.get("args", ()))
    passed_kwargs = dict(outer.arguments.get("kwargs", {}))
    try:
        inner = inspect.signature(block_forward).bind(*passed, **passed_kwargs)
    except TypeError as exc:
        return f"the block cannot take the call the cached blocks make ({exc})"
    for param, token in inner.arguments.items():
        if isinstance(token, dict):
            if any(k != v for k, v in token.items()):
                return "keyword arguments would reach the wrong parameters"
        elif isinstance(token, tuple):
            return "the block takes *args; positional arguments would be reinterpreted"
        elif param != token:
            return f"parameter {param!r} would receive the loop's {token!r}"
    return None


def choose_pattern(block: BlockList, params: list[Param], call_positional: int, call_keywords: list[str],
                   block_forward) -> None:
    """Fill `pattern`, `pattern_reason`, `check_forward_pattern`, `patch_functor_needed` of `block`."""
    from cache_dit.caching.forward_pattern import ForwardPattern

    roles = tuple(block.outputs or ())
    positional = _positional(params)
    names = {p.name for p in params}
    if roles == (H,):
        second = positional[1] if len(positional) > 1 else None
        takes_e = second == E and E in (block.call or {}).get("inputs", {}) \
            and str(block.call["inputs"][E]).startswith("tensor")
        candidates = ["Pattern_2", "Pattern_3"] if takes_e else ["Pattern_3", "Pattern_2"]
    elif roles in ((H, E), (E, H)):
        first_h = roles == (H, E)
        if block.encoder_param is not None:
            candidates = ["Pattern_0" if first_h else "Pattern_1"]
            if len(positional) < 2 or positional[1] != block.encoder_param:
                block.pattern_reason = (f"the block returns an updated {block.encoder_param!r}, but it is not the "
                                        f"block's second parameter; a PatchFunctor must reorder the signature")
                block.patch_functor_needed = True
        else:
            candidates = ["Pattern_4" if first_h else "Pattern_5"]
    else:
        block.pattern = None
        block.patch_functor_needed = True
        block.pattern_reason = (f"the block returns {list(roles) or 'something that is not a tensor or tuple'}; "
                                "every ForwardPattern returns hidden_states (and encoder_hidden_states) only, so a "
                                "PatchFunctor or a wrapper must adapt the return value")
        return
    failures = []
    for name in candidates:
        pattern = ForwardPattern[name]
        problem = _rebinds(pattern, params, call_positional, call_keywords, block_forward)
        if problem is None:
            block.pattern = name
            block.pattern_reason = block.pattern_reason or _describe(pattern, roles, block)
            break
        failures.append(f"{name}: {problem}")
    else:
        block.pattern = candidates[0]
        block.patch_functor_needed = True
        block.pattern_reason = ("the outputs match " + candidates[0] + ", but the loop calls the block in a way the "
                                "cached blocks cannot forward (" + "; ".join(failures) + "): a PatchFunctor must "
                                "make the loop pass hidden_states (and encoder_hidden_states) first")
    missing = [n for n in ForwardPattern[block.pattern].In if n not in names]
    block.check_forward_pattern = not missing
    if missing:
        first = positional[0] if positional else None
        block.pattern_reason += (f"; the signature lacks {missing} (its first input is {first!r}), so cache-dit's "
                                 "static check fails: set check_forward_pattern=False")


def _describe(pattern, roles: tuple, block: BlockList) -> str:
    inputs = "(hidden_states)" if pattern.Forward_H_only else "(hidden_states, encoder_hidden_states)"
    out = "(" + ", ".join("H" if r == H else "E" for r in roles) + ")"
    return f"{pattern.name}: takes {inputs}, returns {out}, observed (evidence: {block.role_evidence})"


def audit_loop(block: BlockList, record, h_param: str | None) -> None:
    """Extra work between block calls: changed hidden states, per-block arguments, skipped or repeated blocks."""
    expected = list(range(block.length))
    if record.order != expected:
        block.loop_findings.append(f"blocks were called in the order {record.order[:12]}"
                                   f"{'...' if len(record.order) > 12 else ''}, not 0..{block.length - 1} once each")
    roles = block.outputs or []
    targets = {H: h_param, E: block.encoder_param}
    for transition in record.transitions:
        for position, role in enumerate(roles):
            want = targets.get(role)
            if want is None:
                continue
            got = transition.flows.get(position)
            if got is None or got[0] != want:
                block.loop_findings.append(
                    f"{role} changes between block {transition.index - 1} and block {transition.index}: the loop "
                    "does work between block calls, which a cached block list would skip")
                break
        changed = [a for a in transition.changed_args if a not in targets.values()]
        if changed:
            block.loop_findings.append(f"block {transition.index} gets different {changed} than block 0: "
                                       "per-block arguments are not supported by the cached block list")
    block.loop_findings = list(dict.fromkeys(block.loop_findings))[:6]
    if block.loop_findings:
        block.patch_functor_needed = True


def analyse_block_list(transformer_name: str, attribute: str, blocks, record) -> BlockList:
    block0 = blocks[0]
    params = _signature(block0.forward)
    returns = inspect.signature(block0.forward).return_annotation
    info = BlockList(
        transformer=transformer_name, attribute=attribute, length=len(blocks), block_class=type(block0).__name__,
        block_module=type(block0).__module__, source_file=source_file(block0), signature=params,
        returns="" if returns is inspect.Signature.empty else str(returns))
    if record is None or record.first_call is None:
        info.pattern_reason = "not called during the run, so its outputs were not observed"
        return info
    info.called = True
    call = record.first_call
    positional = _positional(params)
    info.call = {"positional": positional[:call.positional], "keyword": call.keywords,
                 "inputs": {k: tensor_summary(v) for k, v in call.bound.items()}}
    roles, evidence, encoder_param = output_roles(record, params)
    info.outputs, info.role_evidence, info.encoder_param = roles, evidence, encoder_param
    info.output_shapes = [tensor_summary(o) for o in (as_outputs(record.first_outputs) or [record.first_outputs])]
    if roles is not None:
        choose_pattern(info, params, call.positional, call.keywords, block0.forward)
    else:
        info.patch_functor_needed = True
        info.pattern_reason = (f"the block returns {type(record.first_outputs).__name__}, not a tensor or a tuple; "
                               "no ForwardPattern applies")
    if positional and positional[0] != H and info.check_forward_pattern is not False:
        info.pattern_reason += (f"; the first input is named {positional[0]!r}, not 'hidden_states': "
                                "check_forward_pattern must be False")
        info.check_forward_pattern = False
    audit_loop(info, record, positional[0] if positional else None)
    return info


def between_lists(transformer_name: str, record) -> list[str]:
    """What happens to hidden states between consecutive block lists (in call order)."""
    order = []
    for event in record.events:
        name = event.rsplit(".", 1)[0]
        if name in record.lists and name not in order:
            order.append(name)
    findings = []
    for a, b in zip(order, order[1:]):
        previous, first = record.lists[a]._previous, record.lists[b].first_call
        flows = match_flows(previous, first.bound) if first else {}
        tensors = [i for i, v in enumerate(previous or ()) if hasattr(v, "shape")]
        if tensors and all(i in flows for i in tensors):
            findings.append(f"{transformer_name}: {a} -> {b}: outputs pass on unchanged "
                            f"({', '.join(f'{flows[i][0]}' for i in tensors)})")
        else:
            findings.append(f"{transformer_name}: {a} -> {b}: the hidden states change between the lists "
                            "(e.g. a concatenation); a cached adapter covering both lists must reproduce it")
        start = record.events.index(f"{b}.0") if f"{b}.0" in record.events else None
        end = max((i for i, e in enumerate(record.events) if e.startswith(a + ".")), default=None)
        if start is not None and end is not None and record.events[end + 1:start]:
            findings.append(f"{transformer_name}: between {a} and {b} the transformer calls "
                            f"{record.events[end + 1:start]}")
    return findings


def calls_inside_loop(record, name: str) -> list[str]:
    """Direct children of the transformer called between the first and the last block of list `name`."""
    positions = [i for i, e in enumerate(record.events) if e.startswith(name + ".")]
    if not positions:
        return []
    inside = record.events[positions[0]:positions[-1] + 1]
    return sorted({e for e in inside if e.rsplit(".", 1)[0] not in record.lists})


# -- attention ----------------------------------------------------------------------------------------------------
def _linear_out(module, name: str) -> int | None:
    layer = getattr(module, name, None)
    return getattr(layer, "out_features", None)


def _module_heads(module) -> tuple[int | None, int | None, int | None]:
    heads = getattr(module, "heads", None) or getattr(module, "num_heads", None)
    heads = heads if isinstance(heads, int) else None
    q_out = _linear_out(module, "to_q") or _linear_out(module, "q_proj")
    k_out = _linear_out(module, "to_k") or _linear_out(module, "k_proj")
    head_dim = getattr(module, "head_dim", None) if isinstance(getattr(module, "head_dim", None), int) else None
    if head_dim is None and heads and q_out:
        head_dim = q_out // heads
    kv_heads = getattr(module, "kv_heads", None) if isinstance(getattr(module, "kv_heads", None), int) else None
    if kv_heads is None and head_dim and k_out:
        kv_heads = k_out // head_dim
    return heads, kv_heads, head_dim


def analyse_attention(transformers: dict[str, Any], probe: Probe, sequence: Sequence) -> Attention:
    import torch

    result = Attention()
    for t_name, transformer in transformers.items():
        record = probe.transformers[t_name]
        modules: dict[str, Any] = {}
        lists = set(block_lists(transformer))
        for path, module in transformer.named_modules():
            if not path:
                continue
            parts = path.split(".")
            if len(parts) > 1 and parts[0] in lists and parts[1].isdigit():
                parts[1] = "*"
            group = ".".join(parts)
            if isinstance(module, torch.nn.Linear) and "qkv" in parts[-1].lower():
                _add(result.fused_qkv, f"{t_name}.{group}")
            if not is_attention_module(module):
                continue
            modules.setdefault(group, module)
            backend = getattr(getattr(module, "processor", None), "_attention_backend", None)
            if backend is not None:
                _add(result.attention_backends, f"{t_name}.{group}: {backend}")
            heads, _, head_dim = _module_heads(module)
            for norm_name in ("norm_q", "norm_k"):  # a norm over heads * head_dim spans every head
                weight = getattr(getattr(module, norm_name, None), "weight", None)
                if weight is not None and heads and head_dim and heads > 1 and weight.numel() == heads * head_dim:
                    _add(result.qk_norm_across_heads, f"{t_name}.{group}.{norm_name}")
        for group, module in modules.items():
            heads, kv_heads, head_dim = _module_heads(module)
            observed = record.attention.get(group)
            item = AttentionGroup(t_name, group, type(module).__name__,
                                  type(getattr(module, "processor", None)).__name__
                                  if getattr(module, "processor", None) is not None else None,
                                  observed.calls if observed else 0, heads, kv_heads, head_dim)
            if observed and observed.sdpa:
                first = observed.sdpa[0]
                if len(first.query) == 4:
                    item.kernel_heads, item.kernel_kv_heads = first.query[-3], first.key[-3]
                item.kernel_head_dim = first.query[-1]
                item.q_len, item.kv_len = first.query[-2], first.key[-2]
                item.enable_gqa = any(c.enable_gqa for c in observed.sdpa)
                item.kind = _attention_kind(item.q_len, item.kv_len, sequence)
            if observed:
                kernel_masks = [c for c in observed.sdpa if c.mask is not None or c.is_causal]
                item.mask = bool(observed.mask_kwargs or kernel_masks)
                for key in observed.mask_kwargs:
                    result.mask_sources.append(f"attention {t_name}.{group}({key})")
                for c in kernel_masks[:1]:
                    what = f"attn_mask {list(c.mask)}" if c.mask is not None else "is_causal=True"
                    result.mask_sources.append(f"kernel {t_name}.{group}: {what}")
                    if c.mask_all_true is not None:
                        result.mask_all_true = c.mask_all_true if result.mask_all_true is None \
                            else result.mask_all_true and c.mask_all_true
            result.groups.append(item)
        for c in record.sdpa_outside_modules[:1]:
            if c.mask is not None:
                result.mask_sources.append(f"kernel {t_name} (outside attention modules): attn_mask {list(c.mask)}")
        result.non_pytorch_kernels += _kernels(transformer)
    _mask_inputs(probe, result)
    result.mask = any(s.startswith(("attention ", "kernel ")) for s in result.mask_sources)
    main = next((g for g in result.groups if g.kind in ("self", "joint") and g.calls), None) \
        or next((g for g in result.groups if g.calls), None) or next(iter(result.groups), None)
    if main is not None:
        result.heads = main.heads or main.kernel_heads
        result.head_dim = main.head_dim or main.kernel_head_dim
        result.kv_heads = main.kv_heads or main.kernel_kv_heads or result.heads
        result.gqa = bool(result.heads and result.kv_heads and result.kv_heads < result.heads)
    result.non_pytorch_kernels = list(dict.fromkeys(result.non_pytorch_kernels))
    return result


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _attention_kind(q_len: int, kv_len: int, sequence: Sequence) -> str:
    if q_len != kv_len:
        return "cross"
    if sequence.text_tokens and sequence.image_tokens and q_len == sequence.image_tokens + sequence.text_tokens:
        return "joint"
    return "self"


def _mask_inputs(probe: Probe, result: Attention) -> None:
    """Mask-like arguments given to the transformer or to its blocks, including inside *attention_kwargs dicts."""
    import torch

    def scan(where: str, bound: dict[str, Any]) -> None:
        for key, value in bound.items():
            if "mask" in key and isinstance(value, torch.Tensor):
                result.mask_sources.append(f"{where}({key})")
            if isinstance(value, dict):
                for inner, v in value.items():
                    if "mask" in str(inner) and v is not None:
                        result.mask_sources.append(f"{where}({key}[{inner!r}])")

    for name, record in probe.transformers.items():
        if record.first_call is not None:
            scan(f"transformer input {name}", record.first_call.bound)
        for list_name, list_record in record.lists.items():
            if list_record.first_call is not None:
                scan(f"block input {name}.{list_name}", list_record.first_call.bound)
    result.mask_sources = list(dict.fromkeys(result.mask_sources))


def _kernels(transformer) -> list[str]:
    """Modules and imported callables of the transformer's code that come from non-PyTorch kernel packages."""
    found = []
    code_modules = set()
    for path, module in transformer.named_modules():
        root = type(module).__module__.split(".")[0]
        if root in KERNEL_PACKAGES:
            found.append(f"module {path or '<root>'}: {type(module).__module__}.{type(module).__name__}")
        code_modules.add(type(module).__module__)
        processor = getattr(module, "processor", None)
        if processor is not None:
            code_modules.add(type(processor).__module__)
    for name in sorted(code_modules):
        namespace = vars(sys.modules[name]) if name in sys.modules else {}
        for attr, value in namespace.items():
            origin = getattr(value, "__module__", None) or getattr(value, "__name__", None)
            if isinstance(origin, str) and origin.split(".")[0] in KERNEL_PACKAGES:
                found.append(f"code {name} uses {attr} from {origin}")
    return found


# -- sequence and divisibility ------------------------------------------------------------------------------------
def analyse_sequence(record, lists: list[BlockList]) -> tuple[Sequence, int | None]:
    """The sequence entering the first block list that runs, its batch, per-token tables and gather points."""
    import torch

    sequence = Sequence()
    called = [b for b in lists if b.called]
    first_event: dict[str, int] = {}
    for i, event in enumerate(record.events):
        first_event.setdefault(event.rsplit(".", 1)[0], i)
    called.sort(key=lambda b: first_event.get(b.attribute, math.inf))
    if not called:
        return sequence, None
    first = called[0]
    bound = record.lists[first.attribute].first_call.bound
    h_param = _positional(first.signature)[0] if _positional(first.signature) else None
    hidden = bound.get(h_param)
    batch = None
    if isinstance(hidden, torch.Tensor) and hidden.ndim == 3:
        batch, sequence.image_tokens = hidden.shape[0], hidden.shape[1]
    e_param = first.encoder_param or (E if E in bound else None)
    text = bound.get(e_param) if e_param else None
    if isinstance(text, torch.Tensor) and text.ndim == 3:
        sequence.text_tokens = text.shape[1]
    sequence.attention_tokens = sequence.image_tokens
    _tables_and_gathers(record, sequence, hidden, text, first.attribute)
    return sequence, batch


def _leaves(value: Any):
    """Tensors inside a value (tuples, lists and dicts are searched)."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif hasattr(value, "shape"):
        yield value


def _tables_and_gathers(record, sequence: Sequence, hidden, text, first_list: str) -> None:
    """Per-token tables (outputs of modules run before the blocks that reach the blocks with a sequence-long dim)
    and gather candidates (modules run after the blocks whose output still has the image sequence)."""
    import torch

    s_img, s_txt = sequence.image_tokens, sequence.text_tokens
    lengths = {n: what for n, what in ((s_img, "image"), (s_txt, "text"),
                                       ((s_img or 0) + (s_txt or 0), "image + text")) if n}
    events = record.events
    block_inputs = {id(t) for t in _leaves(record.lists[first_list].first_call.bound)}
    first_block = events.index(f"{first_list}.0") if f"{first_list}.0" in events else len(events)
    last_block = max((i for i, e in enumerate(events) if e.rsplit(".", 1)[0] in record.lists), default=-1)
    for name in dict.fromkeys(events[:first_block]):
        found = []
        for i, out in enumerate(_leaves(record.child_outputs.get(name))):
            if out is hidden or out is text or id(out) not in block_inputs:
                continue
            dims = [d for d, n in enumerate(out.shape) if n in lengths]
            if dims:
                found.append(f"output {i} {list(out.shape)} (dim {dims[0]}: {lengths[out.shape[dims[0]]]} tokens)")
        if found:
            sequence.per_token_tables.append(f"{name}: " + ", ".join(found))
    for name in dict.fromkeys(events[last_block + 1:]):
        out = record.child_outputs.get(name)
        if isinstance(out, torch.Tensor) and out.ndim == 3 and out.shape[1] == s_img:
            sequence.gather_candidates.append(name)


def divisibility(sequence: Sequence, heads: int | None, kv_heads: int | None) -> dict[str, dict[str, Any]]:
    def div(n: int | None, r: int) -> bool | None:
        return None if n is None else n % r == 0

    table = {}
    for r in RANKS:
        row = {"image_tokens": div(sequence.image_tokens, r), "text_tokens": div(sequence.text_tokens, r),
               "heads": div(heads, r), "kv_heads": div(kv_heads, r)}
        split = [row["image_tokens"]] + ([row["text_tokens"]] if sequence.joint else [])
        seq_ok = all(x is not False for x in split)
        row["ulysses"] = "ok" if seq_ok and row["heads"] is not False and row["kv_heads"] is not False \
            else "ulysses-anything"
        row["ring"] = seq_ok
        row["tp"] = row["heads"] is not False and row["kv_heads"] is not False
        table[str(r)] = row
    return table


# -- tensor-parallel layer survey ---------------------------------------------------------------------------------
_QKV = re.compile(r"(^|\.)(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj|q_proj|k_proj|v_proj|query|key|value|"
                  r"wq|wk|wv|to_added_q|to_added_k|to_added_v)$")
_OUT = re.compile(r"(^|\.)(to_out(\.0)?|to_add_out|o_proj|out_proj|wo|proj_attn)$")
_MOD = re.compile(r"(^|\.)(norm\w*\.linear|adaLN\w*|\w*modulation\w*(\.\d+)?|scale_shift\w*)$")


def tp_layers(block, dim: int | None = None) -> list[dict[str, Any]]:
    """Linear layers of one block with a first-guess TP style (a draft: every row must be reviewed).

    Attention projections and modulation layers are recognised by name. Of the other layers (FFN and the like),
    one that reads the block width `dim` is Colwise and one that writes it back is Rowwise.
    """
    import torch

    rows = []
    for name, module in block.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        n_in, n_out = module.in_features, module.out_features
        if "qkv" in name.rsplit(".", 1)[-1].lower():
            style = "fused QKV: un-fuse into q/k/v (Colwise) or keep it Replicate"
        elif _QKV.search(name):
            style = "Colwise"
        elif _OUT.search(name):
            style = "Rowwise"
        elif _MOD.search(name):
            style = "Colwise(output_layouts=Replicate())"
        elif dim is not None and n_in == dim and n_out != dim:
            style = "Colwise (reads the block width)"
        elif dim is not None and n_out == dim and n_in != dim:
            style = "Rowwise (writes the block width)"
        else:
            style = "review (no guess)"
        rows.append({"layer": name, "in": n_in, "out": n_out, "style": style})
    return rows


def _analyse_lists(name: str, transformer, record) -> tuple[list[BlockList], list[str]]:
    lists = [analyse_block_list(name, attribute, blocks, record.lists.get(attribute) if record else None)
             for attribute, blocks in block_lists(transformer).items()]
    if record is None:
        return lists, []
    for block in lists:
        inside = calls_inside_loop(record, block.attribute)
        if inside:
            block.loop_findings.append(f"the loop also calls {inside} between blocks; a cached block list would "
                                       "skip that work")
            block.patch_functor_needed = True
    return lists, between_lists(name, record)


def observe_transformer(transformer, run, name: str = "transformer") -> tuple[list[BlockList], list[str], int]:
    """Block lists of a bare transformer, observed while `run()` calls it (e.g. a forward with dummy inputs).

    Returns the block lists, the findings between lists, and how often the transformer was called. When `run`
    raises, the exception propagates; `static_block_lists` gives what can be read without a call.
    """
    import torch

    probe = Probe({name: transformer})
    with torch.no_grad(), probe:
        run()
    record = probe.transformers[name]
    lists, between = _analyse_lists(name, transformer, record)
    return lists, between, record.calls


def static_block_lists(transformer, name: str = "transformer") -> list[BlockList]:
    """Block lists and block signatures only (nothing observed)."""
    return _analyse_lists(name, transformer, None)[0]


# -- putting it together ------------------------------------------------------------------------------------------
def _warnings(anatomy: Anatomy) -> list[str]:
    notes = []
    adapter = anatomy.cache_dit.get("adapter")
    if adapter and adapter["has_separate_cfg"] != anatomy.has_separate_cfg:
        notes.append(f"cache-dit's registered adapter uses has_separate_cfg={adapter['has_separate_cfg']}, but "
                     f"this run made {anatomy.calls_per_step} transformer calls per step: with these call "
                     "arguments the cond and uncond calls would share (or split) one cache context wrongly")
    if adapter:
        observed = {(b.transformer, b.attribute): b.pattern for b in anatomy.block_lists}
        for t, lists, patterns in zip(adapter["transformers"], adapter["block_lists"], adapter["forward_patterns"]):
            for names, pattern in zip(lists, patterns):
                for name in names.split(" + "):
                    seen = observed.get((t, name))
                    if not seen or seen == pattern:
                        continue
                    if {seen, pattern} == {"Pattern_2", "Pattern_3"}:
                        notes.append(f"{t}.{name}: cache-dit's adapter declares {pattern}, the run suggests {seen}; "
                                     "both return hidden_states only, so both forward the block's inputs")
                    else:
                        notes.append(f"{t}.{name}: cache-dit's adapter declares {pattern}, but the blocks were "
                                     f"observed to behave as {seen}: the cached blocks would mix up hidden_states "
                                     "and encoder_hidden_states; fix the adapter's forward_pattern")
    if anatomy.calls_per_step and anatomy.calls_per_step > 2:
        notes.append(f"{anatomy.calls_per_step} transformer calls per step: cache-dit alternates cond/uncond by "
                     "call parity, so more than two calls per step breaks its step accounting")
    if anatomy.calls_per_step and anatomy.calls_per_step != int(anatomy.calls_per_step):
        notes.append("the transformer calls do not divide evenly into steps; some calls happen outside the loop")
    if anatomy.attention.mask and anatomy.attention.mask_all_true:
        notes.append("the attention mask was all True in this run; a prompt that needs padding makes it real, "
                     "and CP must reorder it")
    return notes


def analyse(pipe, call: dict[str, Any], *, model: str = "<pipeline>", steps: int | None = None,
            dropped: list[str] | None = None) -> Anatomy:
    """The anatomy of `pipe`, observed by running `pipe(**call)` once (keep the call tiny)."""
    from ditgate.inspect import support as cachedit_support
    from ditgate.inspect import plan as draft_plan

    groups = classify_components(pipe)
    transformers = groups["transformers"]
    if not transformers:
        raise PipelineRunError(f"{type(pipe).__name__} has no transformer component (components: "
                               f"{', '.join(getattr(pipe, 'components', {}))}); ditgate inspect needs a DiT")
    steps = steps or call.get("num_inference_steps") or 2
    probe = run_probe(pipe, transformers, call)

    lists: list[BlockList] = []
    between: list[str] = []
    for t_name, transformer in transformers.items():
        t_lists, t_between = _analyse_lists(t_name, transformer, probe.transformers[t_name])
        lists += t_lists
        between += t_between

    primary = next(iter(transformers))
    sequence, batch = analyse_sequence(probe.transformers[primary], [b for b in lists if b.transformer == primary])
    attention = analyse_attention(transformers, probe, sequence)
    sequence.joint = any(g.kind == "joint" for g in attention.groups)
    if sequence.joint:
        sequence.attention_tokens = (sequence.image_tokens or 0) + (sequence.text_tokens or 0)
    sequence.divisibility = divisibility(sequence, attention.heads, attention.kv_heads)

    total = sum(r.calls for r in probe.transformers.values())
    if probe.step_calls:
        marks = [0] + probe.step_calls
        by_step = [b - a for a, b in zip(marks, marks[1:])]
        calls_per_step = float(Counter(by_step).most_common(1)[0][0])
    else:
        by_step = []
        calls_per_step = total / steps if steps else None
    tp = {}
    for t_name, transformer in transformers.items():
        for attribute, blocks in block_lists(transformer).items():
            record = probe.transformers[t_name].lists.get(attribute)
            first = _positional(_signature(blocks[0].forward))[:1]
            hidden = record.first_call.bound.get(first[0]) if record and record.first_call and first else None
            dim = hidden.shape[-1] if getattr(hidden, "ndim", 0) == 3 else None
            tp.setdefault(type(blocks[0]).__name__, tp_layers(blocks[0], dim))

    support = cachedit_support.lookup(pipe, transformers, groups["text_encoders"], groups["vaes"])
    public_call = {k: v for k, v in call.items() if isinstance(v, (str, int, float, bool, type(None), list))}
    anatomy = Anatomy(
        model=model, pipeline=_component("pipeline", pipe), call=public_call, steps=steps,
        components={k: [_component(n, o) for n, o in v.items()] for k, v in groups.items()},
        block_lists=lists, between_lists=between, calls_per_step=calls_per_step, calls_by_step=by_step,
        transformer_calls={n: r.calls for n, r in probe.transformers.items()},
        has_separate_cfg=bool(calls_per_step and calls_per_step >= 2), batch=batch, attention=attention,
        sequence=sequence, tp_layers=tp, cache_dit=support.to_dict())
    anatomy.warnings = _warnings(anatomy)
    if dropped:
        anatomy.warnings.append(f"the pipeline's __call__ does not take {dropped}; they were left out of the run")
    anatomy.plan = draft_plan.render(anatomy)
    return anatomy


def inspect_model(model: str, *, height: int | None = None, width: int | None = None, frames: int | None = None,
                  steps: int = 2, pipeline: str | None = None, trust_remote_code: bool = False,
                  dtype: str = "float32", device: str = "cpu") -> Anatomy:
    """Load `model` (a folder or `zoo:NAME`) with `ditgate.load` and return its anatomy."""
    from ditgate import zoo
    from ditgate.core.loader import load, resolve

    path = resolve(model)
    pipe = load(path, dtype=dtype, device=device, pipeline=pipeline, trust_remote_code=trust_remote_code)
    defaults = zoo.read_meta(path).get("call")
    call, dropped = build_call(pipe, defaults, height=height, width=width, frames=frames, steps=steps)
    return analyse(pipe, call, model=str(model), steps=steps, dropped=dropped)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    import os
    import tempfile

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


__all__ = ["Anatomy", "analyse", "inspect_model", "build_call", "classify_components", "observe_transformer",
           "static_block_lists", "write_text_atomic"]
