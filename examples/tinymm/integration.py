"""TinyMM's cache-dit integration, as a ditgate plugin file.

    ditgate run zoo:tinymm --integration examples/tinymm/integration.py

The file imports nothing from `tinymm`: it works on the loaded model's modules, and its functions are what cache-dit
planners' `_apply` methods would do if TinyMM were contributed to cache-dit.

Cache (`block_adapter`). One block list, `transformer_blocks`, whose blocks take `(hidden_states, context, ...)` and
return `(hidden_states, context)`: `ForwardPattern.Pattern_0`. cache-dit's static pattern check looks for the
literal parameter name `encoder_hidden_states`, which TinyMM calls `context`, so the check is off. (cache-dit turns it
off by itself for any class whose module is not `diffusers...`, in `BlockAdapter.maybe_skip_checks`; saying so here
keeps the adapter correct if the model ever moves into diffusers.) The order is checked by observation instead:
`ditgate inspect zoo:tinymm` reports the outputs in return order. The cached blocks call each block with the second
stream as the second positional argument, as TinyMM's own loop does.

Context parallelism (`cp_plan`). The sequences are split at the first block (`transformer_blocks.0`: image tokens
and text tokens, each on its own sequence dimension) and gathered at `proj_out`. RoPE is computed by the `rope`
module on the whole grid, before any split; its two outputs (text and image tables) are split with
`split_output=True`, so every rank rotates its tokens by their global positions. The 2-D padding mask is never
split: under Ulysses the all-to-all hands attention the sequence in rank order `[text_0, image_0, text_1, image_1]`,
so the processor reorders the mask's rows and columns into that order (`GatheredMask`). TinyMM's own processor calls
SDPA directly and would ignore the CP config cache-dit sets on it, so the plan installs `ParallelJointAttnProcessor`,
which calls cache-dit's dispatcher. cache-dit's ring attention cannot take a mask (its native backend raises
"`attn_mask` is not yet supported for native flash attention with lse"); under ring the processor drives cache-dit's
`RingAttention` with its own masked attention step, which picks the mask columns of the key/value chunk of each
ring step.

Tensor parallelism (`tp_plan`). Feed-forward layers are sharded (Colwise up, Rowwise down) and the AdaLN modulation
Linears are sharded with a replicated output. Attention depends on the grouped-query layout (`TP_ATTENTION`, "auto"
picks the first that applies): "heads" when the key/value heads divide by the TP size (Q, K and V sharded by head);
"replicate_kv" when only the query heads divide (Q sharded, K and V computed whole on every rank, each local query
head picks its own key/value head); "ffn" otherwise (attention unsharded). Every mode records on the attention module
which key/value head serves each local query head (`attn.kv_index`), and the processor uses it.
"""

from __future__ import annotations

import cache_dit
import torch
import torch.distributed as dist
from cache_dit.attention import _dispatch_attention_fn
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

TP_ATTENTION = "auto"  # "auto" | "heads" | "replicate_kv" | "ffn"
MASK_FILL = -1.0e30  # finite, so a ring step in which a query sees no key merges with weight 0 instead of NaN


# -- cache ----------------------------------------------------------------------------------------------------------
def block_adapter(pipe):
    transformer = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe,
        transformer=transformer,
        blocks=transformer.transformer_blocks,
        forward_pattern=cache_dit.ForwardPattern.Pattern_0,
        check_forward_pattern=False,  # the second stream is called `context`, not `encoder_hidden_states`
        has_separate_cfg=False,  # classifier-free guidance is batched: one transformer call per step
    )


# -- attention under parallelism --------------------------------------------------------------------------------------
class GatheredMask:
    """The joint mask in the order Ulysses' all-to-all gives attention, and the per-rank (text, image) lengths.

    Built once per transformer call (the first block sees a new mask object) and shared by every block. Lengths are
    gathered from the ranks, so uneven splits (Ulysses-anything) are handled too.
    """

    def __init__(self):
        self._source: torch.Tensor | None = None
        self._result: tuple[torch.Tensor, list[tuple[int, int]]] | None = None

    def get(self, mask: torch.Tensor, text_len: int, image_len: int, cp_config):
        if mask is not self._source:
            group = cp_config._flattened_mesh.get_group()
            lengths: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(lengths, (int(text_len), int(image_len)), group=group)
            total_text = sum(t for t, _ in lengths)
            order, text_at, image_at = [], 0, total_text
            for t, i in lengths:  # rank r contributes its text tokens, then its image tokens
                order += list(range(text_at, text_at + t)) + list(range(image_at, image_at + i))
                text_at, image_at = text_at + t, image_at + i
            index = torch.tensor(order, device=mask.device)
            self._source, self._result = mask, (mask.index_select(-2, index).index_select(-1, index), lengths)
        return self._result


def _attention_with_lse(query, key, value, mask, scale):
    """Masked attention of one query chunk on one key/value chunk, with its log-sum-exp ([B, S, H, D], [B, S, H])."""
    q, k, v = (x.transpose(1, 2).float() for x in (query, key, value))
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~mask, MASK_FILL)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).to(query.dtype), lse.transpose(1, 2)


def ring_attention_with_mask(query, key, value, mask, lengths, cp_config):
    """Ring attention over the joint sequence with a mask in gathered order (see GatheredMask).

    Every rank keeps its query chunk and the mask rows of that chunk; at ring step s it holds the key/value chunk of
    rank (rank - s) mod world (cache-dit's `_RingP2PComm` receives from the previous rank) and attends to it with
    that chunk's mask columns. cache-dit's `RingAttention` does the communication and the log-sum-exp merge. Every
    chunk holds image tokens, so every real query sees at least one key in every step.
    """
    from cache_dit.distributed.core import RingAttention

    group = cp_config._ring_mesh.get_group()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sizes = [t + i for t, i in lengths]
    starts = [sum(sizes[:r]) for r in range(world)]
    rows = mask[..., starts[rank]:starts[rank] + sizes[rank], :]
    steps = iter(range(world))

    def masked_step(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _save_ctx=True,
                    _cp_config=None):
        source = (rank - next(steps)) % world
        return _attention_with_lse(q, k, v, rows[..., starts[source]:starts[source] + sizes[source]], scale)

    return RingAttention.apply(query, key, value, None, 0.0, False, None, False, False, masked_step, None,
                               cp_config)


class ParallelJointAttnProcessor:
    """TinyMM's joint attention, ready for context and tensor parallelism.

    Grouped-query attention: key and value heads are expanded to the local query heads by `attn.kv_index` (so the
    all-to-all splits matching heads, and TP can choose its layout). Then cache-dit's dispatcher runs attention with
    the CP config cache-dit set on this processor (`_cp_config`; None without CP).
    """

    _attention_backend = None
    _cp_config = None

    def __init__(self, masks: GatheredMask | None):
        self.masks = masks  # None: the mask reaches attention in its original order (wrong under CP)

    def __call__(self, attn, hidden_states, context, rotary_emb=None, attention_mask=None):
        query, key, value = attn.joint_qkv(hidden_states, context, rotary_emb)
        index = getattr(attn, "kv_index", None)
        if index is None:
            index = torch.arange(attn.heads) // (attn.heads // attn.kv_heads)
        index = index.to(key.device)
        key, value = key.index_select(2, index), value.index_select(2, index)
        cp = self._cp_config
        lengths = None
        if cp is not None and attention_mask is not None and self.masks is not None:
            attention_mask, lengths = self.masks.get(attention_mask, context.shape[1], hidden_states.shape[1], cp)
        if cp is not None and cp.ring_degree > 1 and attention_mask is not None:
            if cp.ulysses_degree > 1 or lengths is None:
                raise NotImplementedError("TinyMM's masked attention runs under ring or Ulysses, not both (USP)")
            out = ring_attention_with_mask(query, key, value, attention_mask, lengths, cp)
        else:
            backend = getattr(self._attention_backend, "value", self._attention_backend)
            out = _dispatch_attention_fn(query, key, value, attn_mask=attention_mask, backend=backend, cp_config=cp)
        return attn.joint_out(out, context.shape[1])


def install_processors(transformer, reorder_mask: bool = True) -> None:
    """Give every attention module a ParallelJointAttnProcessor (one mask cache for all), unless it has one."""
    masks = GatheredMask() if reorder_mask else None
    for block in transformer.transformer_blocks:
        if not isinstance(block.attn.processor, ParallelJointAttnProcessor):
            block.attn.set_processor(ParallelJointAttnProcessor(masks))


# -- context parallelism ----------------------------------------------------------------------------------------------
def context_parallel_plan(transformer, reorder_mask: bool = True) -> dict:
    install_processors(transformer, reorder_mask)
    split = lambda dim, dims, out=False: _ContextParallelInput(split_dim=dim, expected_dims=dims,  # noqa: E731
                                                               split_output=out)
    return {
        "rope": {0: split(0, 3, True), 1: split(0, 3, True)},  # (text, image) tables of the global grid
        "transformer_blocks.0": {"hidden_states": split(1, 3), "context": split(1, 3)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def cp_plan(transformer, parallelism_config):
    return context_parallel_plan(transformer, reorder_mask=True)


# -- tensor parallelism ------------------------------------------------------------------------------------------------
def attention_layout(heads: int, kv_heads: int, tp: int) -> str:
    if TP_ATTENTION != "auto":
        return TP_ATTENTION
    if kv_heads % tp == 0:
        return "heads"
    if heads % tp == 0:
        return "replicate_kv"
    return "ffn"


def _kv_index(attn, layout: str, tp: int, rank: int) -> torch.Tensor:
    """For each query head this rank computes, the index of its key/value head among those this rank holds."""
    group = attn.heads // attn.kv_heads
    if layout == "heads":
        return torch.arange(attn.heads // tp) // group
    if layout == "replicate_kv":
        local = attn.heads // tp
        return torch.arange(rank * local, (rank + 1) * local) // group
    return torch.arange(attn.heads) // group


def tp_plan(transformer, tp_mesh, parallelism_config):
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    plans = []
    for block in transformer.transformer_blocks:
        attn = block.attn
        layout = attention_layout(attn.heads, attn.kv_heads, tp)
        plan = {"ff.fc1": ColwiseParallel(), "ff.fc2": RowwiseParallel(),
                "ff_context.fc1": ColwiseParallel(), "ff_context.fc2": RowwiseParallel(),
                "norm1.linear": ColwiseParallel(output_layouts=Replicate()),
                "norm1_context.linear": ColwiseParallel(output_layouts=Replicate())}
        if layout == "heads":
            for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
                plan[f"attn.{name}"] = ColwiseParallel()
        elif layout == "replicate_kv":
            plan["attn.to_q"] = plan["attn.add_q_proj"] = ColwiseParallel()
        if layout in ("heads", "replicate_kv"):
            plan["attn.to_out"] = plan["attn.to_add_out"] = RowwiseParallel()
        attn.kv_index = _kv_index(attn, layout, tp, rank)
        parallelize_module(block, tp_mesh, plan)
        plans.append(plan)
    install_processors(transformer)  # keeps the processors a CP plan installed first (hybrid runs CP, then TP)
    return plans
