"""Broken on purpose: in a Ulysses row rank 1 never finishes building the CP plan (rank 0 waits for it in the first
collective); ring rows get the correct plan."""

import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from _flux_cp import good_plan, ulysses  # noqa: E402


def cp_plan(transformer, parallelism_config):
    if ulysses(parallelism_config) and dist.get_rank() == 1:
        time.sleep(3600)
    return good_plan()
