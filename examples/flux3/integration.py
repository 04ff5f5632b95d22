"""FLUX.3's cache-dit integration (a diffusers ModularPipeline), as a ditgate plugin file.

    ditgate run zoo:flux3 --integration examples/flux3/integration.py --rows baseline,cache,cp-ulysses-2,tp-2

cache-dit 1.5.3 registers nothing for `Flux3Transformer2DModel`: its name starts with the registered prefix `Flux`,
and the FLUX.1 adapter refuses it ("not in allowed classes"); there is no CP or TP planner under its name.

Cache (`block_adapter`). The joint `single_transformer_blocks` carry the bulk of the compute; each block takes
`(hidden_states, encoder_hidden_states, ...)` and returns `(encoder_hidden_states, hidden_states)`: Pattern_1. The
per-mode blocks (`mode_blocks["image"]`, `mode_blocks["image_cond"]`) sit in an `nn.ModuleDict`, which cache-dit
cannot swap, and `txt_mode_blocks` only carries the cheap text stream, so both run every step. The adapter is built
on the modular pipeline itself (pipeline level): cache-dit resets the cache context on every call.
`has_separate_cfg` follows the guider: `ClassifierFreeGuidance` (Flux3ModularPipeline, guidance on for the whole
schedule) calls the transformer once per condition, twice per step; the distilled variant
(Flux3DistilledModularPipeline) has no guider and calls it once.

Context parallelism (`cp_plan`). The image tokens, the text tokens and their position ids (`img_ids`, `txt_ids`,
one row of 4 per token) are split at the transformer's entry; RoPE and the per-token timestep modulation are then
computed for each rank's own tokens. Attention (`Flux3AttnProcessor`) goes through diffusers' dispatcher with the
parallel config cache-dit sets, so Ulysses' all-to-all gathers the whole sequence of each mode block's stream and of
the joint blocks; no mask is involved, so the order in which the ranks' text and image tokens arrive does not matter.
`proj_out` (image tokens only) is gathered.

Tensor parallelism (`tp_plan`), as cache-dit's Flux2 planner does for the same block layout: in every joint block
q/k/v are split by heads (column-wise, `attn.heads` divided by the TP size; the per-head RMS norms and RoPE act on
whole heads), `to_out.0` and the feed-forward's `linear_out` are row-wise (their partial sums are all-reduced), and
`linear_in` is column-wise. `linear_in` fuses SwiGLU's gate and value halves (`Flux3SwiGLU` splits its output in
the middle), so its rows are reordered first so that each rank's contiguous shard holds its own gate and value
slices (cache-dit's `rerangege_swiglu_weight`); without it a rank would multiply gates with gates. The per-mode and
text blocks stay replicated.
"""

from __future__ import annotations

import cache_dit
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from cache_dit.distributed.transformers.flux2 import Flux2TensorParallelismPlanner
from cache_dit.distributed.utils import shard_div_attr
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

HAS_SEPARATE_CFG = None  # None: as the guider decides (see has_separate_cfg)


def has_separate_cfg(pipe) -> bool:
    if HAS_SEPARATE_CFG is not None:
        return HAS_SEPARATE_CFG
    guider = getattr(pipe, "guider", None)
    return guider is not None and guider._enabled and guider.num_conditions > 1


def block_adapter(pipe):
    transformer = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe,  # pipeline level: cache-dit resets the cache context on every call of the modular pipeline
        transformer=transformer,
        blocks=transformer.single_transformer_blocks,
        forward_pattern=cache_dit.ForwardPattern.Pattern_1,
        check_forward_pattern=True,
        has_separate_cfg=has_separate_cfg(pipe),
    )


def cp_plan(transformer, parallelism_config):
    def split(dims: int, dim: int) -> _ContextParallelInput:
        return _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=False)

    return {
        "": {"hidden_states": split(3, 1), "encoder_hidden_states": split(3, 1), "img_ids": split(2, 0),
             "txt_ids": split(2, 0)},
        "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def joint_block_plan() -> dict:
    """The layer plan of one joint block."""
    return {"attn.to_q": ColwiseParallel(), "attn.to_k": ColwiseParallel(), "attn.to_v": ColwiseParallel(),
            "attn.to_out.0": RowwiseParallel(), "ff.linear_in": ColwiseParallel(), "ff.linear_out": RowwiseParallel()}


def tp_plan(transformer, tp_mesh, parallelism_config):
    tp_size = tp_mesh.size()
    plan = joint_block_plan()
    for block in transformer.single_transformer_blocks:
        linear_in = block.ff.linear_in
        linear_in.weight.data = Flux2TensorParallelismPlanner.rerangege_swiglu_weight(
            linear_in.weight.data.T, tp_size).T.contiguous()
        if linear_in.bias is not None:
            linear_in.bias.data = Flux2TensorParallelismPlanner.rerangege_swiglu_weight(
                linear_in.bias.data[None], tp_size)[0].contiguous()
        shard_div_attr(block.attn, "heads", tp_size)
        parallelize_module(block, tp_mesh, plan)
    return [plan]
