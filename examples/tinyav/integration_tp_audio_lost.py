"""Broken on purpose: TinyAV's TP plan rebuilds the audio output projection for sharding and never loads its weights
(a fresh layer, zero-initialised, meant to be filled from the original's shards): the transformer's audio velocity
is zero on every step, so the audio never leaves its initial noise. The video path is `integration.py`'s, so the
frames match the baseline exactly; only the audio output's gate can fail the row.
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("tinyav_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
cp_plan = _good.cp_plan


def tp_plan(transformer, tp_mesh, parallelism_config):
    plans = _good.tp_plan(transformer, tp_mesh, parallelism_config)
    old = transformer.audio_proj_out
    fresh = torch.nn.Linear(old.in_features, old.out_features, device=old.weight.device, dtype=old.weight.dtype)
    torch.nn.init.zeros_(fresh.weight)
    torch.nn.init.zeros_(fresh.bias)
    transformer.audio_proj_out = fresh  # the copy of the original's weights is missing
    return plans
