"""Broken on purpose: cache-dit's Wan CP plan, plus a split of the text (`encoder_hidden_states`) at the first block.

Wan's cross-attention runs on each rank's own tokens (its processor passes no CP config when it attends to the
text), so the text must reach every rank whole: split, each rank's image tokens attend to half of the prompt. Every
shape is right and nothing raises. Stitched back together the halves equal the baseline's text, so a diff that only
gathers calls them identical; `ditgate diff` names the split instead.
"""

from cache_dit.distributed.core import _ContextParallelInput
from cache_dit.distributed.transformers.wan import WanContextParallelismPlanner


def cp_plan(transformer, parallelism_config):
    plan = WanContextParallelismPlanner()._apply(transformer=transformer, parallelism_config=parallelism_config)
    plan["blocks.0"] = {**plan.get("blocks.0", {}), "encoder_hidden_states": _ContextParallelInput(
        split_dim=1, expected_dims=3, split_output=False)}
    return plan
