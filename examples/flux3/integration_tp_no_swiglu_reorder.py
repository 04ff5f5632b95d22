"""A planted fault: FLUX.3's TP plan without reordering the fused SwiGLU rows of `ff.linear_in`.

Column-wise sharding then gives rank 0 the first half of the rows (all the gates) and rank 1 the second (all the
values); `Flux3SwiGLU` splits each rank's shard in the middle and multiplies gates with gates. Measured on zoo:flux3
(`ditgate run zoo:flux3 --integration examples/flux3/integration_tp_no_swiglu_reorder.py --rows baseline,tp-2`):
the tp-2 row fails on its latents (max-abs 0.030, gate 4.7e-4) and the diff names
`single_transformer_blocks.0.ff.act_fn` as the first module whose own forward diverges; with the reorder the row
passes at 1.3e-6.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cache_dit.distributed.utils import shard_div_attr
from torch.distributed.tensor.parallel import parallelize_module

_spec = importlib.util.spec_from_file_location("flux3_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

block_adapter = _good.block_adapter
cp_plan = _good.cp_plan


def tp_plan(transformer, tp_mesh, parallelism_config):
    plan = _good.joint_block_plan()
    for block in transformer.single_transformer_blocks:
        shard_div_attr(block.attn, "heads", tp_mesh.size())
        parallelize_module(block, tp_mesh, plan)  # ff.linear_in sharded as saved: gate and value halves apart
    return [plan]
