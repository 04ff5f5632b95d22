"""Broken on purpose: Flux blocks return (encoder_hidden_states, hidden_states) = Pattern_1, declared Pattern_0."""

import cache_dit


def block_adapter(pipe):
    t = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe, transformer=t, blocks=[t.transformer_blocks, t.single_transformer_blocks],
        forward_pattern=[cache_dit.ForwardPattern.Pattern_0, cache_dit.ForwardPattern.Pattern_0])
