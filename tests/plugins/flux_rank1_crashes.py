"""Broken on purpose: rank 1 raises while the CP plan is built."""

import torch.distributed as dist


def cp_plan(transformer, parallelism_config):
    if dist.get_rank() == 1:
        raise RuntimeError("planted failure on rank 1")
    return {}
