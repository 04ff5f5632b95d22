"""TinyMoE's cache-dit integration, as a ditgate plugin file.

    ditgate run zoo:tinymoe --integration examples/tinymoe/integration.py

Cache (`block_adapter`). One block list, `blocks`, whose blocks take and return `hidden_states`:
`ForwardPattern.Pattern_3`.

Context parallelism (`cp_plan`). The image tokens are split at the output of `x_embedder`, before the long skip
takes its copy (a split at the first block would leave the skip whole), and gathered at `proj_out`; the
rotary table (the `rope` module's two calls, concatenated in `forward`) reaches every block unchanged and is split
at `blocks.*`. Expert-choice routing picks each expert's tokens over the whole sequence, so the MoE must see the
whole sequence: the sub-module form gathers the output of `blocks.*.norm2` (the MoE's input, before the router) and
splits the output of `blocks.*.moe` again. Attention goes through cache-dit's dispatcher.

Tensor parallelism (`tp_plan`). Q/K/V Colwise and `to_out` Rowwise (the per-head `q_norm`/`k_norm` act on local
heads unchanged); `ada`, the modulation Linear whose output is chunked in six, `ColwiseParallel(output_layouts=
Replicate())`; the shared SwiGLU's fused `proj_in` is relaid out first, so that rank r's contiguous shard holds
(gate_r, up_r), then Colwise, and `proj_out` Rowwise. The packed experts (`w_in`, `w_out`, 3-D parameters) and the
router stay replicated: Colwise/Rowwise styles take Linear layers only.
"""

from __future__ import annotations

import cache_dit
import torch
from cache_dit.attention import _dispatch_attention_fn
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

CP_SPLIT_DIMS = {"blocks": 1}


def block_adapter(pipe):
    return cache_dit.BlockAdapter(pipe=pipe, transformer=pipe.transformer, blocks=pipe.transformer.blocks,
                                  forward_pattern=cache_dit.ForwardPattern.Pattern_3, check_forward_pattern=False,
                                  has_separate_cfg=False)


class DispatchedAttnProcessor:
    _attention_backend = None
    _cp_config = None

    def __call__(self, attn, hidden_states, rope=None):
        query, key, value = attn.qkv(hidden_states, rope)
        backend = getattr(self._attention_backend, "value", self._attention_backend)
        out = _dispatch_attention_fn(query, key, value, backend=backend, cp_config=self._cp_config)
        return attn.to_out(out.flatten(2))


def install_processors(transformer) -> None:
    for block in transformer.blocks:
        if not isinstance(block.attn.processor, DispatchedAttnProcessor):
            block.attn.set_processor(DispatchedAttnProcessor())


def split(dim: int, dims: int, output: bool = False) -> _ContextParallelInput:
    return _ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=output)


def context_parallel_plan(transformer, whole_sequence_routing: bool = True) -> dict:
    install_processors(transformer)
    plan = {"x_embedder": {0: split(1, 3, output=True)},  # before the long skip takes its copy
            "blocks.*": {"rope": split(0, 3)},
            "proj_out": _ContextParallelOutput(gather_dim=1, expected_dims=3)}
    if whole_sequence_routing:
        plan["blocks.*.norm2"] = _ContextParallelOutput(gather_dim=1, expected_dims=3)  # before the router
        plan["blocks.*.moe"] = {0: split(1, 3, output=True)}  # after the experts
    return plan


def cp_plan(transformer, parallelism_config):
    return context_parallel_plan(transformer)


def relayout_gated(linear: torch.nn.Linear, tp: int) -> None:
    """Reorder the rows of a fused (gate, up) Linear so that a contiguous 1/tp shard holds (gate_r, up_r)."""
    with torch.no_grad():
        for param in (linear.weight, linear.bias):
            if param is None:
                continue
            gate, up = param.chunk(2, dim=0)
            pieces = [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))]
            param.copy_(torch.cat(pieces))


def shard_blocks(transformer, tp_mesh, relayout: bool = True):
    plans = []
    for block in transformer.blocks:
        if relayout:
            relayout_gated(block.moe.shared.proj_in, tp_mesh.size())
        plan = {"attn.to_q": ColwiseParallel(), "attn.to_k": ColwiseParallel(), "attn.to_v": ColwiseParallel(),
                "attn.to_out": RowwiseParallel(), "ada": ColwiseParallel(output_layouts=Replicate()),
                "moe.shared.proj_in": ColwiseParallel(), "moe.shared.proj_out": RowwiseParallel()}
        parallelize_module(block, tp_mesh, plan)
        plans.append(plan)
    install_processors(transformer)
    return plans


def tp_plan(transformer, tp_mesh, parallelism_config):
    return shard_blocks(transformer, tp_mesh)
