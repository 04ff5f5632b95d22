"""zoo:flux treated as a model cache-dit does not know: the integration file of the skill's practice run.

    ditgate run zoo:flux --integration examples/plugins/flux_as_new.py --rows cache,cp-ulysses-2,tp-2,cache+ulysses-2

references/testing.md shows this file; a test keeps the two identical.
"""
from cache_dit import BlockAdapter, ForwardPattern
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def block_adapter(pipe):
    return BlockAdapter(
        pipe=pipe,
        transformer=pipe.transformer,
        blocks=[pipe.transformer.transformer_blocks, pipe.transformer.single_transformer_blocks],
        forward_pattern=[ForwardPattern.Pattern_1, ForwardPattern.Pattern_1],  # both return (E, H)
        has_separate_cfg=False,  # FluxPipeline: one transformer call per step without true CFG
    )


def cp_plan(transformer, parallelism_config):
    return {
        "": {
            "hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3),
            "encoder_hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3),
            "img_ids": _ContextParallelInput(split_dim=0, expected_dims=2),
            "txt_ids": _ContextParallelInput(split_dim=0, expected_dims=2),
        },
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def tp_plan(transformer, tp_mesh, parallelism_config):
    # feed-forward layers only: no head count changes, so no shard_div_attr (see tp.md for attention TP)
    plan = {"ff.net.0.proj": ColwiseParallel(), "ff.net.2": RowwiseParallel(),
            "ff_context.net.0.proj": ColwiseParallel(), "ff_context.net.2": RowwiseParallel()}
    for block in transformer.transformer_blocks:
        parallelize_module(block, tp_mesh, plan)
    return [plan]
