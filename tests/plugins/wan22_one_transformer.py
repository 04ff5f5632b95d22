"""A wrong integration of a two-transformer Wan 2.2 pipeline: its BlockAdapter names `transformer` only (a Wan 2.1
adapter copied over), so cache-dit caches, and under CP splits, the high-noise expert and leaves `transformer_2`,
which serves the low-noise steps after the boundary, whole. Its attention processor falls back to local attention
where no CP config was set, so the row runs and its output matches the baseline: only the proofs can tell."""

from cache_dit import BlockAdapter, ForwardPattern
from cache_dit.distributed.transformers import wan
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

_CP_CALL = getattr(wan, "__patch_WanAttnProcessor__call__")


def _call(self, *args, **kwargs):
    if not hasattr(self, "_cp_config"):  # a processor CP never configured: attention on the local sequence
        self._cp_config = None
    return _CP_CALL(self, *args, **kwargs)


def block_adapter(pipe):
    return BlockAdapter(pipe=pipe, transformer=pipe.transformer, blocks=pipe.transformer.blocks,
                        forward_pattern=ForwardPattern.Pattern_2, has_separate_cfg=True)


def cp_plan(transformer, parallelism_config):
    plan = wan.WanContextParallelismPlanner()._apply(transformer=transformer, parallelism_config=parallelism_config)
    WanAttnProcessor.__call__ = _call
    return plan
