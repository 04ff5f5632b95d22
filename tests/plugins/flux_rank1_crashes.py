"""Broken on purpose: in a Ulysses row rank 1 raises while the CP plan is built; ring rows get the correct plan."""

import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from _flux_cp import good_plan, ulysses  # noqa: E402


def cp_plan(transformer, parallelism_config):
    if ulysses(parallelism_config) and dist.get_rank() == 1:
        raise RuntimeError("planted failure on rank 1")
    return good_plan()
