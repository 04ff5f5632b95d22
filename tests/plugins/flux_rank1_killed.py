"""Broken on purpose: in a Ulysses row rank 1 is killed (SIGKILL: no traceback, no error file) while the CP plan is
built; ring rows get the correct plan."""

import os
import signal
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from _flux_cp import good_plan, ulysses  # noqa: E402


def cp_plan(transformer, parallelism_config):
    if ulysses(parallelism_config) and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return good_plan()
