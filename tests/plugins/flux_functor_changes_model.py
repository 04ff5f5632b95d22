"""Broken on purpose: a patch functor that changes the model (every double block's image output scaled by 1.01).
The cached output still looks like the baseline's; caching off, the latents depart from it."""

import cache_dit


class ScalingFunctor(cache_dit.PatchFunctor):
    def _apply(self, transformer, blocks=None, **kwargs):
        for block in transformer.transformer_blocks:  # a hook keeps forward's signature (the pattern check reads it)
            block.register_forward_hook(lambda module, args, out: (out[0], out[1] * 1.01))
        transformer._is_patched = True
        return transformer


def block_adapter(pipe):
    t = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe, transformer=t, blocks=[t.transformer_blocks, t.single_transformer_blocks],
        forward_pattern=[cache_dit.ForwardPattern.Pattern_1, cache_dit.ForwardPattern.Pattern_1],
        patch_functor=ScalingFunctor())
