"""Broken on purpose: TinyMM's CP plan (examples/tinymm/integration.py) with the position table restarted on each rank.

The sequences are split at the first block as in the correct plan, but the RoPE tables are not split by global
position: every rank takes the first chunk of the text and image tables, so each rank's tokens are rotated as if
they were the first rows of the picture. Every shape is right and nothing raises; in bfloat16 the first-step check
must catch it.
"""

import importlib.util
from pathlib import Path

import torch.distributed as dist

_path = Path(__file__).resolve().parents[2] / "examples" / "tinymm" / "integration.py"
_spec = importlib.util.spec_from_file_location("tinymm_integration_restarted", _path)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def _first_chunk(module, args, output):
    world = dist.get_world_size()
    return tuple(t.chunk(world, dim=0)[0].contiguous() for t in output)


def cp_plan(transformer, parallelism_config):
    plan = _good.context_parallel_plan(transformer)
    del plan["rope"]
    transformer.rope.register_forward_hook(_first_chunk)
    return plan
