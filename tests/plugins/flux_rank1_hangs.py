"""Broken on purpose: rank 1 never finishes building the CP plan; rank 0 waits for it in the first collective."""

import time

import torch.distributed as dist


def cp_plan(transformer, parallelism_config):
    if dist.get_rank() == 1:
        time.sleep(3600)
    from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput

    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)  # noqa: E731
    return {"": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3),
                 "img_ids": split(0, 2), "txt_ids": split(0, 2)},
            "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3)}
