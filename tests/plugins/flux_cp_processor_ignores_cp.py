"""Broken on purpose: the CP plan is right (flux_good.py's), but the double blocks' attention processor ignores the
CP config cache-dit gives it, as a model's own processor that calls SDPA directly does.

Each rank then attends its own half of the joint sequence only: every shape is right and nothing raises, the image
is wrong. The fault is in the attention's processor, between `to_q/k/v` and `to_out`: `ditgate diff` names
`transformer_blocks.0.attn` and says "its processor".
"""

import sys
from pathlib import Path

from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

sys.path.insert(0, str(Path(__file__).parent))
from _flux_cp import good_plan  # noqa: E402


class LocalAttnProcessor(FluxAttnProcessor):
    """FluxAttnProcessor that never sees a parallel config: whatever is set on it, attention runs on local tokens."""

    @property
    def _parallel_config(self):
        return None

    @_parallel_config.setter
    def _parallel_config(self, value):
        pass

    @property
    def _cp_config(self):
        return None

    @_cp_config.setter
    def _cp_config(self, value):
        pass


def cp_plan(transformer, parallelism_config):
    for block in transformer.transformer_blocks:
        block.attn.set_processor(LocalAttnProcessor())
    return good_plan()
