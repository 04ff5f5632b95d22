"""Broken on purpose: the first double block's feed-forward input projection loads the first shard on every rank.

The plan is the correct one of flux_good.py (column-parallel `ff.net.0.proj`, row-parallel `ff.net.2`), but block
0's column shard is then overwritten with rank 0's rows on every rank, as a loader that ignores the shard offset
would. Shapes and collectives stay right; `ditgate diff` names `transformer_blocks.0.ff.net.0.proj`.
"""

import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def tp_plan(transformer, tp_mesh, parallelism_config):
    plan = {"ff.net.0.proj": ColwiseParallel(), "ff.net.2": RowwiseParallel(),
            "ff_context.net.0.proj": ColwiseParallel(), "ff_context.net.2": RowwiseParallel()}
    for block in transformer.transformer_blocks:
        parallelize_module(block, tp_mesh, plan)
    proj = transformer.transformer_blocks[0].ff.net[0].proj
    with torch.no_grad():
        for param in (proj.weight, proj.bias):
            local = param.to_local()
            local.copy_(param.full_tensor()[: local.shape[0]])
    return [plan]
