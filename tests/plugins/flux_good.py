"""A correct integration of the zoo Flux written as a plugin, as if cache-dit did not know Flux.

The block adapter names both block lists; the CP plan splits the image and text sequences (and their position ids)
at the transformer's entry and gathers at `proj_out`; the TP plan shards the double blocks' feed-forward layers.
"""

import cache_dit
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def block_adapter(pipe):
    t = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe, transformer=t, blocks=[t.transformer_blocks, t.single_transformer_blocks],
        forward_pattern=[cache_dit.ForwardPattern.Pattern_1, cache_dit.ForwardPattern.Pattern_1])


def cp_plan(transformer, parallelism_config):
    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)  # noqa: E731
    return {
        "": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3),
             "img_ids": split(0, 2), "txt_ids": split(0, 2)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def tp_plan(transformer, tp_mesh, parallelism_config):
    plan = {"ff.net.0.proj": ColwiseParallel(), "ff.net.2": RowwiseParallel(),
            "ff_context.net.0.proj": ColwiseParallel(), "ff_context.net.2": RowwiseParallel()}
    for block in transformer.transformer_blocks:
        parallelize_module(block, tp_mesh, plan)
    return [plan]
