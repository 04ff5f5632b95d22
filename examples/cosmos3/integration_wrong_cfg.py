"""A planted fault: Cosmos 3 distilled's adapter with the wrong calls-per-step flag (`has_separate_cfg=True`).

This is what cache-dit 1.5.3's registered `Cosmos` adapter declares (cache_dit/caching/block_adapters/adapters.py:
384, right for the undistilled Cosmos3OmniPipeline's cond and uncond passes). The distilled blocks call the
transformer once per step, so cache-dit, told there are two, counts two calls as one step and applies the step
schedule to the wrong calls. The cache row's `cache-cfg` proof fails on it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("cosmos3_integration", Path(__file__).with_name("integration.py"))
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)
_good.HAS_SEPARATE_CFG = True

block_adapter = _good.block_adapter
cp_plan = _good.cp_plan
tp_plan = _good.tp_plan
