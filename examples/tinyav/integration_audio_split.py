"""Broken on purpose: TinyAV's CP plan also splits the audio tokens at the first block (and gathers them at
`audio_proj_out`), while the audio self-attention stays local: each rank's audio attends to its own half only.

Everything else is `integration.py`, whose `CP_SPLIT_DIMS` says the audio stays whole, so the CP proof names the
audio stream. Run it with `--call audio_frames=32`: two ranks do not divide the default 31 audio tokens.
"""

import importlib.util
from pathlib import Path

from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput

_spec = importlib.util.spec_from_file_location("tinyav_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def cp_plan(transformer, parallelism_config):
    plan = _good.cp_plan(transformer, parallelism_config)
    plan["blocks.0"]["encoder_hidden_states"] = _ContextParallelInput(split_dim=1, expected_dims=3,
                                                                      split_output=False)
    plan["audio_proj_out"] = _ContextParallelOutput(gather_dim=1, expected_dims=3)
    return plan
