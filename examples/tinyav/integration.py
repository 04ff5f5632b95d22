"""TinyAV's cache-dit integration, as a ditgate plugin file.

    ditgate run zoo:tinyav --integration examples/tinyav/integration.py

Cache (`block_adapter`). A block takes the video tokens and the audio tokens and returns both, video first:
`ForwardPattern.Pattern_0` (the audio stream stands where a joint block's text stream stands), one call per step.

Context parallelism (`cp_plan`). The video tokens are split at the first block's input (dimension 1 of
`[B, F * N, D]`) and gathered at `proj_out`; the audio tokens (31: two ranks do not divide them) stay whole on every
rank. The video's self-attention goes through cache-dit's dispatcher (the all-to-all); the audio's self-attention
and its cross-attention to the text run locally on whole sequences; its cross-attention to the video gathers the
video tokens of every rank first (`GatheredVideoProcessor`), since each rank holds only its share. `CP_SPLIT_DIMS`
says so per stream: the blocks return (video, audio), video split on dimension 1, audio kept whole (`None`), and
ditgate's CP proof checks each stream against that.

Tensor parallelism (`tp_plan`). Q/K/V Colwise and the output projection Rowwise in every attention module of both
streams (heads are read from the tensors), feed-forward Colwise/Rowwise, and the ada-norm modulation Linears,
whose output is chunked, `ColwiseParallel(output_layouts=Replicate())`.
"""

from __future__ import annotations

import cache_dit
import torch
import torch.nn.functional as F
from cache_dit.attention import _dispatch_attention_fn
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# What CP divides in what the blocks return, per stream: (video, audio) -> video on dimension 1, audio kept whole.
CP_SPLIT_DIMS = {"blocks": (1, None)}


def block_adapter(pipe):
    return cache_dit.BlockAdapter(pipe=pipe, transformer=pipe.transformer, blocks=pipe.transformer.blocks,
                                  forward_pattern=cache_dit.ForwardPattern.Pattern_0, check_forward_pattern=False,
                                  has_separate_cfg=False)


class DispatchedSelfAttnProcessor:
    """The video self-attention through cache-dit's dispatcher, which follows the CP config cache-dit sets here."""

    _attention_backend = None
    _cp_config = None

    def __call__(self, attn, hidden_states, context=None, key_mask=None):
        query, key, value = attn.qkv(hidden_states, context)
        backend = getattr(self._attention_backend, "value", self._attention_backend)
        out = _dispatch_attention_fn(query, key, value, backend=backend, cp_config=self._cp_config)
        return attn.to_out(out.flatten(2))


class GatheredVideoProcessor:
    """The audio's cross-attention to the video: the whole audio queries the video tokens of every CP rank, gathered
    along the sequence (each rank holds a contiguous share, in rank order)."""

    _attention_backend = None
    _cp_config = None

    def __call__(self, attn, hidden_states, context=None, key_mask=None):
        config = self._cp_config
        if config is not None and config._flattened_mesh is not None:
            mesh = config._flattened_mesh
            pieces = [torch.empty_like(context) for _ in range(mesh.size())]
            torch.distributed.all_gather(pieces, context.contiguous(), group=mesh.get_group())
            context = torch.cat(pieces, dim=1)
        query, key, value = attn.qkv(hidden_states, context)
        out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        return attn.to_out(out.transpose(1, 2).flatten(2))


def cp_plan(transformer, parallelism_config):
    for block in transformer.blocks:
        if not isinstance(block.attn.processor, DispatchedSelfAttnProcessor):
            block.attn.set_processor(DispatchedSelfAttnProcessor())
        if not isinstance(block.video_to_audio.processor, GatheredVideoProcessor):
            block.video_to_audio.set_processor(GatheredVideoProcessor())
    return {
        "blocks.0": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def tp_plan(transformer, tp_mesh, parallelism_config):
    plans = []
    attention = ("attn", "cross", "audio_attn", "audio_cross", "video_to_audio")
    for block in transformer.blocks:
        plan = {f"{a}.{p}": ColwiseParallel() for a in attention for p in ("to_q", "to_k", "to_v")}
        plan |= {f"{a}.to_out": RowwiseParallel() for a in attention}
        plan |= {f"{f}.fc1": ColwiseParallel() for f in ("ff", "audio_ff")}
        plan |= {f"{f}.fc2": RowwiseParallel() for f in ("ff", "audio_ff")}
        plan |= {f"{n}.linear": ColwiseParallel(output_layouts=Replicate()) for n in ("norm1", "audio_norm1")}
        parallelize_module(block, tp_mesh, plan)
        plans.append(plan)
    return plans
