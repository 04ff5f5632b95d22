"""Broken on purpose: the CP plan splits the sequence but never gathers it back."""

from cache_dit.distributed.core import _ContextParallelInput


def cp_plan(transformer, parallelism_config):
    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)  # noqa: E731
    return {"": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3),
                 "img_ids": split(0, 2), "txt_ids": split(0, 2)}}
