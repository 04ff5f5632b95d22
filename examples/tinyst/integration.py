"""TinyST's cache-dit integration, as a ditgate plugin file.

    ditgate run zoo:tinyst --integration examples/tinyst/integration.py

Cache (`block_adapter`). The loop interleaves two block lists and rearranges the hidden states between them
(`[B*F, N, D]` for a spatial block, `[B*N, F, D]` for a temporal one). cache-dit caches block lists one after the
other, so two lists interleaved cannot be given to it as two lists: the patch here builds one list of pairs
(`st_pairs[i]` = spatial block i, the rearrangement, temporal block i, the rearrangement back) and a transformer
forward that loops over the pairs; a pair takes and returns `hidden_states` only (`ForwardPattern.Pattern_3`).
cache-dit's own `PatchFunctor.apply` skips classes outside diffusers, so the patch is applied here, before
`BlockAdapter` is built.

Context parallelism (`cp_plan`). The tokens of each frame are split where they are made, at the output of
`x_embedder` (dimension 1 of `[B*F, N, D]`): before the block lists, so that a cached list of pairs sees one
sequence length at its entry and its exit (a split inside the first block breaks cache-dit's residuals). The
temporal blocks then receive `[B * N/world, F, D]`: all frames of the local tokens, so temporal
attention runs locally, and their split dimension is 0. `CP_SPLIT_DIMS` says so, for ditgate's CP proof. The
position table `pos` is built in `forward` and reaches every spatial block unchanged: it is split at
`spatial_blocks.*` (dimension 0), since no module produces it. The frame table and the text stay whole:
cross-attention to the masked text runs locally (the model's own processor, which calls SDPA directly, stays on
`cross`), and so does temporal attention. Only the spatial self-attention goes through cache-dit's dispatcher.
The output is gathered at `proj_out` (dimension 1).

Tensor parallelism (`tp_plan`). Q/K/V Colwise and the output projection Rowwise in every attention module (heads
are read from the tensors, so nothing else changes), feed-forward Colwise/Rowwise, and the AdaLN modulation
Linears, whose output is chunked, `ColwiseParallel(output_layouts=Replicate())`.
"""

from __future__ import annotations

import cache_dit
import torch
from cache_dit.attention import _dispatch_attention_fn
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# The dimension CP divides in what each block list returns (ditgate's CP proof checks it per list).
CP_SPLIT_DIMS = {"spatial_blocks": 1, "temporal_blocks": 0, "st_pairs": 1}


# -- cache ----------------------------------------------------------------------------------------------------------
class TinySTPair(torch.nn.Module):
    """Spatial block i, then temporal block i, with the model's rearrangements between them."""

    def __init__(self, spatial, temporal):
        super().__init__()
        self.spatial, self.temporal = spatial, temporal

    def forward(self, hidden_states, context, temb, pos, frame_pos, context_mask=None):
        batch = temb.shape[0]
        x = self.spatial(hidden_states, context, temb, pos, context_mask)
        x = x.unflatten(0, (batch, -1)).transpose(1, 2).flatten(0, 1)  # [B*F, N, D] -> [B*N, F, D]
        x = self.temporal(x, temb, frame_pos)
        return x.unflatten(0, (batch, -1)).transpose(1, 2).flatten(0, 1)


def _forward_over_pairs(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask=None,
                        return_dict: bool = True):
    """TinyST's forward with one loop over `st_pairs` (same arithmetic as the model's own)."""
    from tinyst.transformer_tinyst import expand_batch, patchify, sincos, unpatchify

    batch, _, frames, height, width = hidden_states.shape
    patch = self.config.patch_size
    grid_h, grid_w = height // patch, width // patch
    x = self.x_embedder(patchify(hidden_states.transpose(1, 2).flatten(0, 1), patch))
    context = self.context_embedder(encoder_hidden_states)
    mask = encoder_attention_mask.bool() if encoder_attention_mask is not None else None
    temb = self.time_embedding(timestep)
    pos = self.position_table(grid_h, grid_w, x.device).to(x.dtype)
    frame_pos = sincos(torch.arange(frames, device=x.device), x.shape[-1]).to(x.dtype)
    for pair in self.st_pairs:
        x = pair(x, context, temb, pos, frame_pos, mask)
    x, _ = self.norm_out(x, expand_batch(temb, x.shape[0]))
    out = unpatchify(self.proj_out(x), grid_h, grid_w, patch).unflatten(0, (batch, frames)).transpose(1, 2)
    return Transformer2DModelOutput(sample=out) if return_dict else (out,)


def patch_pairs(transformer):
    """Give `transformer` one block list of pairs and a forward that loops over it (idempotent)."""
    if not hasattr(transformer, "st_pairs"):
        transformer.st_pairs = torch.nn.ModuleList(
            TinySTPair(s, t) for s, t in zip(transformer.spatial_blocks, transformer.temporal_blocks))
        transformer.forward = _forward_over_pairs.__get__(transformer)
    return transformer


def block_adapter(pipe):
    transformer = patch_pairs(pipe.transformer)
    return cache_dit.BlockAdapter(
        pipe=pipe, transformer=transformer, blocks=transformer.st_pairs,
        forward_pattern=cache_dit.ForwardPattern.Pattern_3,
        check_forward_pattern=False,  # a pair's inputs are not named like a diffusers block's
        has_separate_cfg=False,  # batched classifier-free guidance: one call per step
    )


# -- context parallelism ----------------------------------------------------------------------------------------------
class DispatchedSelfAttnProcessor:
    """TinyST's self-attention through cache-dit's dispatcher, which follows the CP config cache-dit sets here."""

    _attention_backend = None
    _cp_config = None

    def __call__(self, attn, hidden_states, context=None, key_mask=None):
        query, key, value = attn.qkv(hidden_states, context)
        backend = getattr(self._attention_backend, "value", self._attention_backend)
        out = _dispatch_attention_fn(query, key, value, backend=backend, cp_config=self._cp_config)
        return attn.to_out(out.flatten(2))


def install_processors(transformer) -> None:
    for block in transformer.spatial_blocks:
        if not isinstance(block.attn.processor, DispatchedSelfAttnProcessor):
            block.attn.set_processor(DispatchedSelfAttnProcessor())


def _split(dim: int, dims: int, output: bool = False) -> _ContextParallelInput:
    return _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=output)


def cp_plan(transformer, parallelism_config):
    install_processors(transformer)
    return {
        "x_embedder": {0: _split(1, 3, output=True)},  # the tokens of every frame, before any (cached) block list
        "spatial_blocks.*": {"pos": _split(0, 2)},  # built in forward, handed unchanged to every spatial block
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


# -- tensor parallelism ------------------------------------------------------------------------------------------------
def tp_plan(transformer, tp_mesh, parallelism_config):
    plans = []
    attention = {f"{a}.{p}": ColwiseParallel() for a in ("attn", "cross") for p in ("to_q", "to_k", "to_v")}
    attention |= {"attn.to_out": RowwiseParallel(), "cross.to_out": RowwiseParallel()}
    for block in [*transformer.spatial_blocks, *transformer.temporal_blocks]:
        plan = {k: v for k, v in attention.items() if hasattr(block, k.split(".")[0])}
        plan |= {"ff.fc1": ColwiseParallel(), "ff.fc2": RowwiseParallel(),
                 "norm1.linear": ColwiseParallel(output_layouts=Replicate())}
        parallelize_module(block, tp_mesh, plan)
        plans.append(plan)
    return plans
