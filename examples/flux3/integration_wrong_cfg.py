"""A planted fault: FLUX.3's adapter with the wrong calls-per-step flag (`has_separate_cfg=False`).

The CFG guider calls the transformer twice per step, so cache-dit, told there is one call per step, counts every
call as a step and applies the step schedule to the wrong calls. The cache row's `cache-cfg` proof fails on it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("flux3_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)
_good.HAS_SEPARATE_CFG = False

block_adapter = _good.block_adapter
cp_plan = _good.cp_plan
tp_plan = _good.tp_plan
