"""A correct integration of a two-transformer Wan 2.2 pipeline: one BlockAdapter over both experts, so cache-dit
caches and splits each."""

from cache_dit import BlockAdapter, ForwardPattern


def block_adapter(pipe):
    return BlockAdapter(pipe=pipe, transformer=[pipe.transformer, pipe.transformer_2],
                        blocks=[pipe.transformer.blocks, pipe.transformer_2.blocks],
                        forward_pattern=[ForwardPattern.Pattern_2, ForwardPattern.Pattern_2], has_separate_cfg=True)
