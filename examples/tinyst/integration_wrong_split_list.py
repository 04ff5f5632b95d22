"""Broken on purpose: TinyST's integration with only the spatial block list split.

Everything else is `integration.py`. The plan splits the input of every spatial block and gathers its output, so
the temporal blocks run on the whole sequence on every rank. The output is right (nothing is computed differently),
but half the work is not divided: ditgate's CP proof, which checks each block list on the dimension
`CP_SPLIT_DIMS` declares, fails and names `temporal_blocks`.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tinyst_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)

CP_SPLIT_DIMS = _good.CP_SPLIT_DIMS
block_adapter = _good.block_adapter
tp_plan = _good.tp_plan


def cp_plan(transformer, parallelism_config):
    _good.install_processors(transformer)
    return {"spatial_blocks.*": [{"hidden_states": _good._split(1, 3), "pos": _good._split(0, 2)},
                                 _good._ContextParallelOutput(gather_dim=1, expected_dims=3)]}
