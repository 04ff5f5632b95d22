"""Tiny image pipelines with joint (MM-DiT) and single-stream blocks: the Flux lineage, SD3, AuraFlow, HiDream.

Sizes follow the spirit of diffusers' `get_dummy_components`: 1-2 blocks of each kind, 4 heads, text width 32;
32x32 images through a 2-level AutoencoderKL (16x16 latents), so a 2x2-packed image is 64 tokens.
"""

from __future__ import annotations

from ditgate.zoo.builders import _kl_vae, _seeded
from ditgate.zoo.pipelines import encoders as enc
from ditgate.zoo.pipelines.spec import PROMPT, PipelineSpec
from ditgate.zoo.pipelines.spec import image_call as _image


def kl_vae(seed: int, latent_channels: int = 4, shift: float = 0.0, scale: float = 1.0, levels: int = 2, **extra):
    """An AutoencoderKL of `levels` levels (2: latents half the image's size per side) with `latent_channels`."""
    if latent_channels == 4 and levels == 2 and not extra:
        return _kl_vae(seed, shift_factor=shift, scaling_factor=scale)
    from diffusers import AutoencoderKL

    return _seeded(seed, lambda: AutoencoderKL(
        sample_size=32, block_out_channels=(8, 16, 16, 16)[:levels], down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels, layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False, shift_factor=shift,
        scaling_factor=scale, **extra))


def _flux_transformer(seed: int, in_channels: int = 16, out_channels: int | None = None, **extra):
    from diffusers import FluxTransformer2DModel

    return _seeded(seed, lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, out_channels=out_channels, num_layers=2, num_single_layers=2,
        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8], **extra))


def _flux_text(seed: int) -> dict:
    return {"text_encoder": enc.clip(seed + 1), "tokenizer": enc.clip_tokenizer(), "text_encoder_2": enc.t5(seed + 2),
            "tokenizer_2": enc.t5_tokenizer()}


def build_flux_kontext(seed: int = 0):
    """FluxKontextPipeline: the input image's latents join the sequence (64 + 64 image tokens)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline

    return FluxKontextPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 3, shift=0.06, scale=1.5),
                               transformer=_flux_transformer(seed, guidance_embeds=True), **_flux_text(seed))


def build_visualcloze(seed: int = 0):
    """VisualClozeGenerationPipeline: in-context examples and the query laid out in one grid image (Flux Fill)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, VisualClozeGenerationPipeline

    transformer = _flux_transformer(seed, in_channels=16 + 16 + 64, out_channels=16, guidance_embeds=True)
    return VisualClozeGenerationPipeline(scheduler=FlowMatchEulerDiscreteScheduler(),
                                         vae=kl_vae(seed + 3, shift=0.06, scale=1.5), transformer=transformer,
                                         resolution=32, **_flux_text(seed))


def build_flux2_klein(seed: int = 0):
    """Flux2KleinPipeline: Flux2 blocks (shared modulation), a Qwen3 causal LM encoder, the Flux2 VAE."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, \
        Flux2Transformer2DModel

    transformer = _seeded(seed, lambda: Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=96, timestep_guidance_channels=256, axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False))
    vae = _seeded(seed + 3, lambda: AutoencoderKLFlux2(
        sample_size=32, block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=4,
        use_quant_conv=False, use_post_quant_conv=False))
    return Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
                              text_encoder=enc.qwen3(seed + 1, causal=True), tokenizer=enc.llm_tokenizer("qwen2"))


def build_chroma(seed: int = 0):
    """ChromaPipeline: Flux blocks without pooled text; modulation from a distilled approximator; T5 only."""
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: ChromaTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=[4, 4, 8], approximator_hidden_dim=32, approximator_layers=1,
        approximator_num_channels=16))
    return ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 3, shift=0.06, scale=1.5),
                          text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer(), transformer=transformer)


def build_bria(seed: int = 0):
    """BriaPipeline: Flux-like double and single blocks, T5 only, no pooled projection."""
    from diffusers import BriaPipeline, BriaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: BriaTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 8, 8]))
    return BriaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 3, scale=0.13),
                        text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer(), transformer=transformer)


def build_sd3(seed: int = 0):
    """StableDiffusion3Pipeline: joint blocks; two CLIP encoders (pooled) and T5; batched CFG."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = _seeded(seed, lambda: SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        caption_projection_dim=64, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
        pos_embed_max_size=32))
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 4, shift=0.06, scale=1.5),
        text_encoder=enc.clip(seed + 1, projection=True), tokenizer=enc.clip_tokenizer(),
        text_encoder_2=enc.clip(seed + 2, projection=True), tokenizer_2=enc.clip_tokenizer(),
        text_encoder_3=enc.t5(seed + 3), tokenizer_3=enc.t5_tokenizer(), transformer=transformer)


def build_auraflow(seed: int = 0):
    """AuraFlowPipeline: MM-DiT joint blocks then single blocks; UMT5 encoder."""
    from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: AuraFlowTransformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_mmdit_layers=2, num_single_dit_layers=2,
        attention_head_dim=16, num_attention_heads=4, caption_projection_dim=64, joint_attention_dim=32,
        out_channels=4, pos_embed_max_size=256))
    return AuraFlowPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 2),
                            text_encoder=enc.umt5(seed + 1), tokenizer=enc.t5_tokenizer(), transformer=transformer)


def build_hidream(seed: int = 0):
    """HiDreamImagePipeline: double and single blocks with MoE feed-forwards; two CLIPs, T5 and a Llama LM."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline, HiDreamImageTransformer2DModel

    transformer = _seeded(seed, lambda: HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, caption_channels=[32, 32], text_emb_dim=64, num_routed_experts=4,
        num_activated_experts=2, axes_dims_rope=(8, 4, 4), max_resolution=(32, 32), llama_layers=(0, 1)))
    llama = enc.llama(seed + 4, causal=True)
    llama.generation_config.pad_token_id = 0
    return HiDreamImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(seed + 5, shift=0.1159, scale=0.3611),
        text_encoder=enc.clip(seed + 1, projection=True), tokenizer=enc.clip_tokenizer(),
        text_encoder_2=enc.clip(seed + 2, projection=True), tokenizer_2=enc.clip_tokenizer(),
        text_encoder_3=enc.t5(seed + 3), tokenizer_3=enc.t5_tokenizer(),
        text_encoder_4=llama, tokenizer_4=enc.llm_tokenizer("llama"), transformer=transformer)


SPECS = [
    PipelineSpec("flux-kontext", "FluxKontextPipeline", "image",
                 "Flux Kontext (edit): 2 double + 2 single blocks, 4 heads; CLIP + T5; input image tokens join the "
                 "sequence", build_flux_kontext,
                 _image(guidance_scale=2.5, max_sequence_length=32, max_area=32 * 32, _auto_resize=False),
                 image=True),
    PipelineSpec("flux2-klein", "Flux2KleinPipeline", "image",
                 "Flux2 Klein: Flux2 blocks with shared modulation; Qwen3 LM text encoder; Flux2 VAE",
                 build_flux2_klein,
                 _image(guidance_scale=4.0, max_sequence_length=32, text_encoder_out_layers=[0, 1, 2])),
    PipelineSpec("chroma", "ChromaPipeline", "image",
                 "Chroma: Flux blocks, approximator modulation, T5; separate CFG calls", build_chroma,
                 _image(guidance_scale=4.0, negative_prompt="blurry", max_sequence_length=32)),
    PipelineSpec("bria", "BriaPipeline", "image", "Bria 3.2: Flux-like blocks, T5 only; batched CFG",
                 build_bria, _image(guidance_scale=5.0, max_sequence_length=32)),
    PipelineSpec("sd3", "StableDiffusion3Pipeline", "image", "SD3: joint blocks; 2 CLIP + T5; batched CFG",
                 build_sd3, _image(guidance_scale=5.0, max_sequence_length=32)),
    PipelineSpec("auraflow", "AuraFlowPipeline", "image", "AuraFlow: MM-DiT then single blocks; UMT5",
                 build_auraflow, _image(guidance_scale=3.5, max_sequence_length=32)),
    PipelineSpec("hidream", "HiDreamImagePipeline", "image",
                 "HiDream-I1: double + single blocks with MoE FFNs; 2 CLIP + T5 + Llama",
                 build_hidream, _image(guidance_scale=5.0, max_sequence_length=32)),
    PipelineSpec("visualcloze", "VisualClozeGenerationPipeline", "image",
                 "VisualCloze: in-context image grid through Flux Fill blocks", build_visualcloze,
                 {"task_prompt": "Each row turns a gradient into its mirror image.", "content_prompt": PROMPT,
                  "num_inference_steps": 6, "guidance_scale": 30.0, "max_sequence_length": 32},
                 image=True),
]
