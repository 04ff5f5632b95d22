"""A correct tensor-parallel plan for Stable Audio's DiT (cache-dit has none): the attention heads are sharded.

Every attention's q, k and v projections are split by heads (Colwise; 8 query and 4 key-value heads give each of 2
ranks 4 and 2, in the order grouped-query attention pairs them) and its output projection gathers them back
(Rowwise); each attention then computes only its local heads (`heads` divided). The feed-forward layers stay whole:
SwiGLU's projection holds both halves of the gate, which a Colwise split would separate.
"""

from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


def shard_attention(transformer, tp_mesh):
    tp = tp_mesh.size()
    plan = {}
    for name in ("attn1", "attn2"):
        plan |= {f"{name}.to_q": ColwiseParallel(), f"{name}.to_k": ColwiseParallel(),
                 f"{name}.to_v": ColwiseParallel(), f"{name}.to_out.0": RowwiseParallel()}
    for block in transformer.transformer_blocks:
        parallelize_module(block, tp_mesh, plan)
        for attn in (block.attn1, block.attn2):
            attn.heads //= tp
    return [plan]


def tp_plan(transformer, tp_mesh, parallelism_config):
    return shard_attention(transformer, tp_mesh)
