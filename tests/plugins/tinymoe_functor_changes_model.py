"""Broken on purpose: TinyMoE's correct BlockAdapter (examples/tinymoe/integration.py) built by a function that also
changes the model (every block's output scaled by 1.01, as a wrong patch would; cache-dit applies PatchFunctors to
diffusers' own classes only, so the change is made where the adapter is built). Caching off, the latents depart
from the baseline's."""

import cache_dit


def block_adapter(pipe):
    for block in pipe.transformer.blocks:  # a hook keeps forward's signature (the pattern check reads it)
        block.register_forward_hook(lambda module, args, out: out * 1.01)
    return cache_dit.BlockAdapter(pipe=pipe, transformer=pipe.transformer, blocks=pipe.transformer.blocks,
                                  forward_pattern=cache_dit.ForwardPattern.Pattern_3, check_forward_pattern=False,
                                  has_separate_cfg=False)
