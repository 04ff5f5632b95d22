"""Broken on purpose: Q/K/V and the output projection are sharded, but the head count is not divided."""

from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def tp_plan(transformer, tp_mesh, parallelism_config):
    plan = {"attn.to_q": ColwiseParallel(), "attn.to_k": ColwiseParallel(), "attn.to_v": ColwiseParallel(),
            "attn.to_out.0": RowwiseParallel()}
    for block in transformer.transformer_blocks:
        parallelize_module(block, tp_mesh, plan)  # missing: shard_div_attr(block.attn, "heads", tp_mesh.size())
    return [plan]
