"""Tiny image pipelines whose text side is a language model inside or beside the DiT: Krea 2 (Qwen3-VL layers
fed to text blocks), PRX (T5Gemma encoder), OmniGen (the transformer is a Phi-3 LLM over text and image tokens),
Bria FIBO (SmolLM3 layers, structured JSON prompts), Nucleus-MoE (Qwen3-VL; image queries on image + text keys,
diffusers' packed-expert MoE with expert-choice routing and a shared expert).

Same conventions as `image_mmdit`: 4 heads, 32x32 images, seeded weights, eval mode.
"""

from __future__ import annotations

import torch

from ditgate.zoo.builders import _seeded
from ditgate.zoo.pipelines import encoders as enc
from ditgate.zoo.pipelines.image_dit import _qwen_image_parts
from ditgate.zoo.pipelines.image_mmdit import kl_vae
from ditgate.zoo.pipelines.spec import PipelineSpec
from ditgate.zoo.pipelines.spec import image_call as _image


def build_krea2(seed: int = 0):
    """Krea2Pipeline: single-stream blocks with GQA (4 query / 2 KV heads); three Qwen3-VL layers refined by text
    blocks; Qwen-Image VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Krea2Pipeline, Krea2Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLModel

    transformer = _seeded(seed, lambda: Krea2Transformer2DModel(
        in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, timestep_embed_dim=16, text_hidden_dim=32, num_text_layers=3,
        text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=32,
        num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(8, 4, 4), rope_theta=1000.0))
    config = Qwen3VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "head_dim": 8, "vocab_size": len(enc.qwen2_tokenizer()) + 8},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 32},
        vocab_size=len(enc.qwen2_tokenizer()) + 8)
    text_encoder = _seeded(seed + 1, lambda: Qwen3VLModel(config))
    parts = _qwen_image_parts(seed)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=6400)
    return Krea2Pipeline(transformer=transformer, vae=parts["vae"], scheduler=scheduler, text_encoder=text_encoder,
                         tokenizer=enc.llm_tokenizer("qwen2"), text_encoder_select_layers=(0, 1, 2))


def build_nucleusmoe(seed: int = 0):
    """NucleusMoEImagePipeline: 3 single-stream blocks of diffusers' own layers, block 0 dense and blocks 1-2 MoE
    (4 packed SwiGLU experts as 3-D parameters, expert-choice routing over the whole sequence, a shared expert);
    image queries attend to image + text keys concatenated, with the text's padding mask (padded to a multiple of
    8); a 4-layer Qwen3-VL text encoder whose tokenizer stands in for the processor (it takes the same text call).
    The packed experts, which diffusers leaves uninitialised, get seeded weights."""
    from diffusers import FlowMatchEulerDiscreteScheduler, NucleusMoEImagePipeline, \
        NucleusMoEImageTransformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    transformer = _seeded(seed, lambda: NucleusMoEImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6), dense_moe_strategy="leave_first_block_dense",
        num_experts=4, moe_intermediate_dim=32, capacity_factors=1.0))
    generator = torch.Generator().manual_seed(seed + 3)
    for module in transformer.modules():  # the packed experts are made with torch.empty: give them seeded weights
        if type(module).__name__ == "SwiGLUExperts":
            with torch.no_grad():
                for p in (module.gate_up_proj, module.down_proj):
                    p.copy_(0.02 * torch.randn(p.shape, generator=generator))
    tokenizer = enc.llm_tokenizer("qwen2")
    config = Qwen3VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "head_dim": 8, "vocab_size": len(tokenizer) + 8},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 32},
        vocab_size=len(tokenizer) + 8)
    text_encoder = _seeded(seed + 1, lambda: Qwen3VLForConditionalGeneration(config))
    parts = _qwen_image_parts(seed)
    return NucleusMoEImagePipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
                                   vae=parts["vae"], text_encoder=text_encoder, processor=tokenizer)


def build_prx(seed: int = 0):
    """PRXPipeline: single-stream blocks with cross-attention to a T5Gemma encoder's tokens."""
    from diffusers import FlowMatchEulerDiscreteScheduler, PRXPipeline, PRXTransformer2DModel
    from transformers import T5GemmaConfig, T5GemmaModuleConfig
    from transformers.models.t5gemma.modeling_t5gemma import T5GemmaEncoder

    transformer = _seeded(seed, lambda: PRXTransformer2DModel(
        patch_size=2, in_channels=4, context_in_dim=32, hidden_size=64, mlp_ratio=2.0, num_heads=4, depth=2,
        axes_dim=[8, 8]))
    tokenizer = enc.llm_tokenizer("gemma", chat=False)
    tokenizer.model_max_length = 32
    params = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
              "layer_types": ["full_attention"] * 2, "query_pre_attn_scalar": 8, "sliding_window": 64}
    config = T5GemmaConfig(encoder=T5GemmaModuleConfig(**params), is_encoder_decoder=False, **params)
    text_encoder = _seeded(seed + 1, lambda: T5GemmaEncoder(config.encoder))
    return PRXPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
                       tokenizer=tokenizer, vae=kl_vae(seed + 2), default_sample_size=32)


def build_omnigen(seed: int = 0):
    """OmniGenPipeline: a 2-layer Phi-3 over text and image tokens is the transformer; no separate text encoder."""
    from diffusers import FlowMatchEulerDiscreteScheduler, OmniGenPipeline, OmniGenTransformer2DModel

    transformer = _seeded(seed, lambda: OmniGenTransformer2DModel(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, num_layers=2,
        in_channels=4, time_step_dim=16, vocab_size=300, pad_token_id=0,
        rope_scaling={"long_factor": [1.0] * 8, "short_factor": [1.0] * 8}))
    return OmniGenPipeline(transformer=transformer, vae=kl_vae(seed + 1, levels=4),
                           scheduler=FlowMatchEulerDiscreteScheduler(invert_sigmas=True, num_train_timesteps=1),
                           tokenizer=enc.llm_tokenizer("llama", chat=False))


def build_bria_fibo(seed: int = 0):
    """BriaFiboPipeline: Flux-like double + single blocks fed SmolLM3 hidden states; the Wan 2.2 VAE (16x, 2x2
    patches)."""
    from diffusers import AutoencoderKLWan, BriaFiboPipeline, BriaFiboTransformer2DModel, \
        FlowMatchEulerDiscreteScheduler
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    transformer = _seeded(seed, lambda: BriaFiboTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=64, text_encoder_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 8, 8]))
    vae = _seeded(seed + 2, lambda: AutoencoderKLWan(
        base_dim=32, decoder_base_dim=32, num_res_blocks=1, out_channels=12, patch_size=2, scale_factor_spatial=16,
        scale_factor_temporal=4, temperal_downsample=[False, True, True], z_dim=16))
    text_encoder = _seeded(seed + 1, lambda: SmolLM3ForCausalLM(SmolLM3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=300, pad_token_id=0)))
    return BriaFiboPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                            text_encoder=text_encoder, tokenizer=enc.t5_tokenizer())


SPECS = [
    PipelineSpec("krea2", "Krea2Pipeline", "image",
                 "Krea 2: GQA single-stream blocks; Qwen3-VL layers through text blocks; Qwen-Image VAE",
                 build_krea2, _image(guidance_scale=4.0)),
    PipelineSpec("nucleusmoe", "NucleusMoEImagePipeline", "image",
                 "Nucleus-MoE: image queries on image + padded text keys; packed experts, expert-choice routing, "
                 "a shared expert; 64x64 -> 64 tokens", build_nucleusmoe,
                 _image(size=64, guidance_scale=4.0, negative_prompt="blurry", return_index=-2), family=False),
    PipelineSpec("prx", "PRXPipeline", "image", "PRX: single-stream blocks, cross-attention to T5Gemma",
                 build_prx, _image(guidance_scale=4.0, use_resolution_binning=False)),
    PipelineSpec("omnigen", "OmniGenPipeline", "image",
                 "OmniGen: a Phi-3 LLM over text + image tokens is the transformer; 64x64 (8x VAE) -> 16 tokens",
                 build_omnigen, _image(size=64, guidance_scale=3.0)),
    PipelineSpec("bria-fibo", "BriaFiboPipeline", "image",
                 "Bria FIBO: Flux-like blocks on SmolLM3 layers; structured JSON prompt; Wan 2.2 VAE (16x); 64x64",
                 build_bria_fibo, _image(size=64, prompt='{"text": "a tiny red cube on a table"}',
                                         negative_prompt="blurry", guidance_scale=5.0)),
]
