"""Broken on purpose: Stable Audio blocks take and return hidden_states only (Pattern_3); declared Pattern_0."""

import cache_dit


def block_adapter(pipe):
    t = pipe.transformer
    return cache_dit.BlockAdapter(pipe=pipe, transformer=t, blocks=t.transformer_blocks,
                                  forward_pattern=cache_dit.ForwardPattern.Pattern_0)
