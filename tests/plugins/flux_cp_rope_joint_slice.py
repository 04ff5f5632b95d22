"""Broken on purpose: the RoPE table is sliced over the joint sequence instead of stream by stream.

The image and text sequences are split at the transformer's entry, so rank r attends over `[text_r, image_r]`. The
position ids are left whole and each rank takes its r-th chunk of the joint `[text, image]` table: rank 0 gets the
text positions and the first image rows, rank 1 the rest of the image. Every shape is right and nothing raises;
the positions of most tokens are wrong. `ditgate diff` names `pos_embed`.
"""

import torch.distributed as dist
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput


def _joint_chunk(module, args, output):
    world, rank = dist.get_world_size(), dist.get_rank()
    return tuple(t.chunk(world, dim=0)[rank] for t in output)


def cp_plan(transformer, parallelism_config):
    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)  # noqa: E731
    transformer.pos_embed.register_forward_hook(_joint_chunk)
    return {
        "": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }
