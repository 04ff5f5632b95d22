"""Broken on purpose: TinyMoE's integration with the MoE left on each rank's slice of the sequence.

Everything else is `integration.py`, without the gather before the router and the split after the experts. Each
expert then takes its best `capacity` tokens of the local slice (and the capacity is computed from the slice's
length), so other tokens are routed than on one device: the CP gate fails on the tensor rule.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tinymoe_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def cp_plan(transformer, parallelism_config):
    return _good.context_parallel_plan(transformer, whole_sequence_routing=False)
