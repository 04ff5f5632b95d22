"""Two realistic faults on purpose, each of which passes every bf16 gate of a 16-block Wan (tests/test_twin_rows.py)
and fails in float32 on its twin.

- CP: cache-dit's Wan CP plan, but the last block's self-attention runs on a processor that calls SDPA directly. It
  never sees the CP configuration cache-dit sets, so under CP each rank attends only to its own tokens there.
- TP: cache-dit's Wan TP plan, but the last block's cross-attention head count is not divided by the TP size (its
  self-attention's is, and every other block's both): each rank splits its half of the projections into the full
  number of heads, each half as wide. The call runs.
"""

import torch.nn.functional as F
from cache_dit.distributed.transformers.wan import DistributedRMSNorm, WanContextParallelismPlanner
from cache_dit.distributed.utils import shard_div_attr
from diffusers.models.transformers.transformer_wan import _get_qkv_projections
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _rotate(x, cos, sin):
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = x.clone()
    out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]
    out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]
    return out


class LocalSDPA:
    """Wan self-attention through F.scaled_dot_product_attention: what a model's own processor often does."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q, k, v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q, k = attn.norm_q(q), attn.norm_k(k)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
        if rotary_emb is not None:
            q, k = _rotate(q, *rotary_emb), _rotate(k, *rotary_emb)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def cp_plan(transformer, parallelism_config):
    plan = WanContextParallelismPlanner()._apply(transformer=transformer, parallelism_config=parallelism_config)
    transformer.blocks[-1].attn1.set_processor(LocalSDPA())
    return plan


def tp_plan(transformer, tp_mesh, parallelism_config):
    plans = []
    for i, block in enumerate(transformer.blocks):
        shard_div_attr(block.attn1, "heads", tp_mesh.size())
        if i < len(transformer.blocks) - 1:  # missing for the last block's cross-attention
            shard_div_attr(block.attn2, "heads", tp_mesh.size())
        plan = {f"{a}.{p}": ColwiseParallel() for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v")}
        plan |= {"attn1.to_out.0": RowwiseParallel(), "attn2.to_out.0": RowwiseParallel(),
                 "ffn.net.0.proj": ColwiseParallel(), "ffn.net.2": RowwiseParallel()}
        parallelize_module(block, tp_mesh, plan)
        for attn in (block.attn1, block.attn2):
            attn.norm_q = DistributedRMSNorm.from_rmsnorm(tp_mesh, attn.norm_q)
            attn.norm_k = DistributedRMSNorm.from_rmsnorm(tp_mesh, attn.norm_k)
        plans.append(plan)
    return plans
