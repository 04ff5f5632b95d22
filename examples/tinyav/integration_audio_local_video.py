"""Broken on purpose: TinyAV's CP plan without the gather in the audio's cross-attention to the video: the whole
audio on each rank attends only to that rank's share of the video tokens. The video path is `integration.py`'s, so
the frames match the baseline exactly; only the audio output's gate can fail the row.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tinyav_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def cp_plan(transformer, parallelism_config):
    plan = _good.cp_plan(transformer, parallelism_config)
    for block in transformer.blocks:  # the model's own processor: local attention on the local video tokens
        block.video_to_audio.set_processor(type(block.cross.processor)())
    return plan
