"""Broken on purpose: the zoo Flux's CP plan with the position table restarted on each rank.

The image and text sequences are split at the transformer's entry as in flux_good.py, but the position ids are not:
every rank takes the first chunk of `img_ids` and `txt_ids`, so the positions of each rank's tokens start again at
the first row of the picture. Every shape is right and nothing raises; in float32 the tensor rule catches it, in
bfloat16 the first-step check must.
"""

import torch.distributed as dist
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput


def _first_chunk(module, args, kwargs):
    world = dist.get_world_size()
    for key in ("img_ids", "txt_ids"):
        ids = kwargs.get(key)
        if ids is not None:
            kwargs[key] = ids.chunk(world, dim=0)[0]
    return args, kwargs


def cp_plan(transformer, parallelism_config):
    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)
    transformer.register_forward_pre_hook(_first_chunk, with_kwargs=True)
    return {
        "": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }
