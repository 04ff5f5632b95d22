"""Attention, as observed: groups of attention modules with their heads, K/V heads, head size, masks and kernels, and the linear layers tensor parallelism shards."""

from __future__ import annotations


import re
import sys
from typing import Any
from ditgate.inspect.observe import Probe, _group_name, block_lists, is_attention_module
from ditgate.inspect.model import Attention, AttentionGroup, KERNEL_PACKAGES, Sequence


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
    if heads is None and head_dim and q_out and q_out % head_dim == 0:  # the head count under another name
        heads = q_out // head_dim
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
            group = _group_name(path, lists)
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
        result.kernel_kv_heads = main.kernel_kv_heads
        result.gqa = bool(result.heads and result.kv_heads and result.kv_heads < result.heads)
    result.non_pytorch_kernels = list(dict.fromkeys(result.non_pytorch_kernels))
    return result


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _attention_kind(q_len: int, kv_len: int, sequence: Sequence) -> str:
    """From the observed lengths: "joint" when the keys hold the image and the text tokens together (queries over
    both, or image queries over image + text keys concatenated: the keys then contain the queries' own tokens, so
    a split of the image splits the keys too), "cross" when the keys come from elsewhere, else "self"."""
    img, txt = sequence.image_tokens, sequence.text_tokens
    if img and txt and kv_len == img + txt and q_len in (img, img + txt):
        return "joint"
    return "self" if q_len == kv_len else "cross"


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


# -- tensor-parallel layer survey ---------------------------------------------------------------------------------
_QKV = re.compile(r"(^|\.)(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj|q_proj|k_proj|v_proj|query|key|value|"
                  r"wq|wk|wv|to_added_q|to_added_k|to_added_v)$")


_OUT = re.compile(r"(^|\.)(to_out(\.0)?|to_add_out|o_proj|out_proj|wo|proj_attn)$")


_MOD = re.compile(r"(^|\.)(norm\w*\.linear|adaLN\w*|\w*modulation\w*(\.\d+)?|scale_shift\w*)$")


def tp_survey(transformers: dict[str, Any], probe: Probe) -> dict[str, list[dict[str, Any]]]:
    """`tp_layers` of the first block of each structure of each block list, keyed by the block class, or by
    `Class[blocks]` where blocks of one class differ (`ditgate.inspect.variants`)."""
    from ditgate.inspect.blocks import _positional, _signature
    from ditgate.inspect.variants import span, variants

    tp: dict[str, list[dict[str, Any]]] = {}
    for t_name, transformer in transformers.items():
        for attribute, blocks in block_lists(transformer).items():
            record = probe.transformers[t_name].lists.get(attribute)
            first = _positional(_signature(blocks[0].forward))[:1]
            hidden = record.first_call.bound.get(first[0]) if record and record.first_call and first else None
            dim = hidden.shape[-1] if getattr(hidden, "ndim", 0) in (2, 3) else None  # [batch,] tokens, features
            groups = variants(blocks)
            for g in groups:
                key = type(blocks[0]).__name__ + (f"[{span(g)}]" if len(groups) > 1 else "")
                tp.setdefault(key, tp_layers(blocks[g[0]], dim))
    return tp


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
