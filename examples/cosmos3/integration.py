"""Cosmos 3 distilled's cache-dit integration (a diffusers ModularPipeline), as a ditgate plugin file.

    ditgate run zoo:cosmos3-distilled --integration examples/cosmos3/integration.py \\
        --rows baseline,cache,cp-ulysses-2,tp-2

The transformer (`Cosmos3OmniTransformer`) packs one sequence with no batch dimension: a causal "understanding"
stream (the prompt's token ids, embedded by the transformer) and a "generation" stream (the vision tokens). Every
decoder layer takes `(und_seq, gen_seq, rotary_emb)` and returns `(und_seq, gen_seq)`, both `[tokens, hidden]`.

Cache (`block_adapter`). cache-dit 1.5.3 registers an adapter for it (the `Cosmos` prefix, cache_dit/caching/
block_adapters/adapters.py:370-386) with `Cosmos3OmniPatchFunctor`, which puts the generation stream first so the
cache decides on the denoised tokens, not on the near-static text stream. Its patched transformer forward cannot
be called by diffusers 0.42.1: it has no `return_dict` parameter (cache_dit/caching/patch_functors/
functor_cosmos3.py:77-103) and both the modular denoiser (diffusers modular_pipelines/cosmos/denoise.py:240-241,
`components.transformer(**transformer_kwargs, return_dict=False)`) and the standard Cosmos3OmniPipeline
(pipelines/cosmos/pipeline_cosmos3_omni.py:1781) pass it: the cache row fails with a TypeError. It also drops the
model's context-parallel seams and the time embedder's dtype cast. The functor here keeps the model's own forward
and only swaps the streams: each layer gets cache-dit's `(gen, und)` layer forward, and `_run_decoder_stack`
(the layer loop the forward calls) passes the streams in that order: ForwardPattern.Pattern_0. The order matters
under a residual threshold, not under the default static schedule: `integration_text_first.py` (the layers as they
come, text first) caches every step on a residual diff of exactly 0 and fails on latents.
`has_separate_cfg` is False: guidance is distilled, the blocks force `guidance_scale` to 1.0
(modular_pipelines/cosmos/before_denoise.py:1360-1368, Cosmos3DistilledSetTimestepsStep) and the denoiser then runs only its "cond" pass, one call per
step (denoise.py:205-210); cache-dit's registered adapter declares True (adapters.py:384) (right for the undistilled Cosmos3OmniPipeline's two passes).

Context parallelism (`cp_plan`): the cp-ulysses-2 row fails, and no plan can make it pass with cache-dit 1.5.3.
cache-dit has no planner for the class. The plan here splits the first layer's two streams and the four RoPE tables
(cos/sin of each stream) on the token dimension (every later layer gets the full RoPE tuple again from the loop, so
the RoPE is split on every layer), and gathers the final norms' outputs (`norm`, `norm_moe_gen`) before the vision
tokens are read out by their global indexes; each stream's length must divide by the CP size (cache-dit's
equipartition sharder asserts it). The rows then stop inside attention: `Cosmos3AttnProcessor` calls causal GQA
attention for the text stream (diffusers models/transformers/transformer_cosmos3.py:94-100, `is_causal=True,
enable_gqa=True`; the generation stream's call has `enable_gqa=True`, :107-115), and cache-dit's templated CP
attention refuses causal attention (cache_dit/attention/backends/register.py:313-314, "Causal attention is not yet
supported for templated attention", reached through cache_dit/attention/backends/native.py:141) and GQA without a
`cp_gqa_strategy` (:317-318), which diffusers' dispatcher never passes. diffusers' own templated CP attention refuses
both as well (models/attention_dispatch.py:2925-2928), and the model says its CP lives outside the declarative plan,
behind the `_cp_shard_fn` / `_cp_gather_fn` seams and a CP attention processor of its own (transformer_cosmos3.py:
380-389; the helper it names, examples/cosmos3/cosmos_parallel.py, ships in diffusers' repository, not its
package). A limitation of the libraries, not of the tiny model: the released checkpoints use the same processor.
The plan is kept so that the row reaches that limit (without it the row stops at "No planner registered").

Tensor parallelism (`tp_plan`), both pathways of every layer: q/k/v (`to_*`, `add_*_proj`) column-wise with the
query and KV head counts divided by the TP size (the per-head RMS norms and RoPE act on whole heads), `to_out` and
`to_add_out` row-wise; each MLP (`mlp`, `mlp_moe_gen`: separate gate and up projections, no fused halves)
column-wise in, `down_proj` row-wise.
"""

from __future__ import annotations

import cache_dit
from cache_dit.caching.patch_functors import functor_cosmos3
from cache_dit.caching.patch_functors.functor_base import PatchFunctor
from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput
from cache_dit.distributed.utils import shard_div_attr
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

HAS_SEPARATE_CFG = False  # distilled guidance: one transformer call per step


def _gen_first_stack(self, und_seq, gen_seq, rotary_emb):
    """Cosmos3OmniTransformer._run_decoder_stack with the generation stream passed first."""
    for layer in self.layers:
        gen_seq, und_seq = layer(gen_seq, und_seq, rotary_emb)
    return self.norm(und_seq), self.norm_moe_gen(gen_seq)


class GenStreamFirst(PatchFunctor):
    def _apply(self, transformer, **kwargs):
        layer_forward = getattr(functor_cosmos3, "__patch_layer_forward__")
        for layer in transformer.layers:
            layer.forward = layer_forward.__get__(layer)
        transformer._run_decoder_stack = _gen_first_stack.__get__(transformer)
        transformer._is_patched = True
        return transformer


def block_adapter(pipe):
    transformer = pipe.transformer
    return cache_dit.BlockAdapter(
        pipe=pipe,  # pipeline level: cache-dit resets the cache context on every call of the modular pipeline
        transformer=transformer,
        blocks=transformer.layers,
        forward_pattern=cache_dit.ForwardPattern.Pattern_0,
        patch_functor=GenStreamFirst(),
        check_forward_pattern=True,
        has_separate_cfg=HAS_SEPARATE_CFG,
    )


def cp_plan(transformer, parallelism_config):
    split = _ContextParallelInput(split_dim=0, expected_dims=2, split_output=False)
    gather = _ContextParallelOutput(gather_dim=0, expected_dims=2)
    # parameters by the layer class's names; the split is the same for both streams whichever order they come in
    return {
        "layers.0": {"und_seq": split, "gen_seq": split},
        "layers.*": {"rotary_emb": [split] * 4},
        "norm": gather,
        "norm_moe_gen": gather,
    }


def layer_plan() -> dict:
    plan = {}
    for q, k, v, out in (("to_q", "to_k", "to_v", "to_out"), ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")):
        plan.update({f"self_attn.{q}": ColwiseParallel(), f"self_attn.{k}": ColwiseParallel(),
                     f"self_attn.{v}": ColwiseParallel(), f"self_attn.{out}": RowwiseParallel()})
    for mlp in ("mlp", "mlp_moe_gen"):
        plan.update({f"{mlp}.gate_proj": ColwiseParallel(), f"{mlp}.up_proj": ColwiseParallel(),
                     f"{mlp}.down_proj": RowwiseParallel()})
    return plan


def tp_plan(transformer, tp_mesh, parallelism_config):
    plan = layer_plan()
    for layer in transformer.layers:
        shard_div_attr(layer.self_attn, "num_attention_heads", tp_mesh.size())
        shard_div_attr(layer.self_attn, "num_key_value_heads", tp_mesh.size())
        parallelize_module(layer, tp_mesh, plan)
    return [plan]
