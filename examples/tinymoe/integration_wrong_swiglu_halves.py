"""Broken on purpose: TinyMoE's integration with the fused SwiGLU sharded as if its halves were separate Linears.

Everything else is `integration.py`, but `proj_in` is sharded Colwise without the relayout: with 2 ranks, rank 0
holds the gate rows only and rank 1 the up rows, and `chunk(2)` of each rank's shard pairs the wrong halves. Nothing
crashes; the TP gate fails on the tensor rule.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tinymoe_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
cp_plan = _good.cp_plan


def tp_plan(transformer, tp_mesh, parallelism_config):
    return _good.shard_blocks(transformer, tp_mesh, relayout=False)
