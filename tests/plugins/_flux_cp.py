"""The correct CP plan of the zoo Flux, shared by the planted faults below (see flux_good.py)."""

from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput


def good_plan():
    split = lambda dim, dims: _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)  # noqa: E731
    return {"": {"hidden_states": split(1, 3), "encoder_hidden_states": split(1, 3),
                 "img_ids": split(0, 2), "txt_ids": split(0, 2)},
            "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3)}


def ulysses(parallelism_config) -> bool:
    return (parallelism_config.ulysses_size or 1) > 1
