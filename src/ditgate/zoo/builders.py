"""Seeded builders of tiny but real diffusers pipelines.

Every weight comes from `torch.manual_seed`, every module is put in eval mode (T5's dropout would otherwise make two
identical calls differ), and every width divides by 2 and 4 so that Ulysses, ring and tensor parallelism over 2 or
4 ranks have something to split. `build_tinymm` imports the `tinymm` package from the repository's `examples/`
folder (`ditgate.core.examples`).
"""

from __future__ import annotations

import torch

from ditgate.zoo.tokenizers import QWEN_SPECIAL_TOKENS, clip_tokenizer, qwen2_tokenizer, t5_tokenizer


def _seeded(seed: int, make):
    torch.manual_seed(seed)
    return make().eval()


def _t5(seed: int, d_model: int):
    """A 2-layer T5 encoder (4 heads x 8) of width `d_model`, for the byte-level `t5_tokenizer`."""
    from transformers import T5Config, T5EncoderModel

    return _seeded(seed, lambda: T5EncoderModel(T5Config(
        vocab_size=256, d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)))


def _kl_vae(seed: int, shift_factor: float, scaling_factor: float):
    """A 2-level AutoencoderKL (one downsampling: latents half the image's size per side) with 4 latent channels."""
    from diffusers import AutoencoderKL

    return _seeded(seed, lambda: AutoencoderKL(
        sample_size=32, block_out_channels=(8, 16), down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2, layers_per_block=1, latent_channels=4, norm_num_groups=4,
        use_quant_conv=False, use_post_quant_conv=False, shift_factor=shift_factor, scaling_factor=scaling_factor))


def build_flux(seed: int = 0):
    """FluxPipeline: 2 double-stream + 4 single-stream blocks, 4 heads x 16, CLIP + T5 text encoders."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    d_text = 32
    transformer = _seeded(seed, lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=4, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=d_text, pooled_projection_dim=d_text, guidance_embeds=False,
        axes_dims_rope=[4, 4, 8]))
    clip = _seeded(seed + 1, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=d_text, intermediate_size=64,
        num_attention_heads=4, num_hidden_layers=2, vocab_size=600, projection_dim=d_text)))
    t5 = _t5(seed + 2, d_text)
    vae = _kl_vae(seed + 3, shift_factor=0.0609, scaling_factor=1.5035)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip,
                        tokenizer=clip_tokenizer(), text_encoder_2=t5, tokenizer_2=t5_tokenizer(),
                        transformer=transformer)


def build_wan(seed: int = 0):
    """WanPipeline (Wan 2.1 text-to-video): 4 blocks, 4 heads x 12, UMT5 encoder, causal 3-D VAE."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    transformer = _seeded(seed, lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32))
    umt5 = _seeded(seed + 1, lambda: UMT5EncoderModel(UMT5Config(
        vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)))
    # base_dim 8, not less: a 3-channel random VAE decodes to low-contrast frames whose SSIM reacts to noise-level
    # latent changes (a correct cache schedule then scored 29.5 dB / SSIM 0.78 on the worst frame; 52.9 / 0.999 here)
    vae = _seeded(seed + 2, lambda: AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]))
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), transformer=transformer)


def qwen_image_transformer_and_vae(seed: int):
    """zoo:qwen-image's transformer (seed) and VAE (seed + 2), shared by the Qwen-Image pipelines of zoo.pipelines."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    transformer = _seeded(seed, lambda: QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=4, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(8, 4, 4)))
    vae = _seeded(seed + 2, lambda: AutoencoderKLQwenImage(
        base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1, temperal_downsample=[False, True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4))
    return transformer, vae


def build_qwen_image(seed: int = 0):
    """QwenImagePipeline: 4 blocks, 4 heads x 16, a tiny Qwen2.5-VL text encoder; true CFG (two calls per step)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen2_tokenizer()
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN_SPECIAL_TOKENS}
    vocab_size = len(tokenizer) + 8
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "vocab_size": vocab_size, "bos_token_id": 0, "eos_token_id": 0,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": 32},
        hidden_size=32, vocab_size=vocab_size, vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|image_pad|>"])
    text_encoder = _seeded(seed + 1, lambda: Qwen2_5_VLForConditionalGeneration(config))
    transformer, vae = qwen_image_transformer_and_vae(seed)
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=transformer)


def _tinymm_trained_like(transformer, seed: int) -> None:
    """Three departures from default initialisation, so that the gates see what they would see on a trained model.

    - `proj_out` x4: over 8 steps the latents then move from their noise (std 1) by 1.7 on average per element
      instead of 0.5, so the transformer, not the initial noise, shapes the decoded image;
    - attention output projections x4: attention carries a real share of each block's update;
    - image queries and keys of one key/value group share a bias vector: with RoPE, a shared direction scores
      neighbouring positions highest, so image attention becomes local, as in trained DiTs. A random model instead
      mixes every token with every other one in each block, and a corruption confined to a few tokens (a misplaced
      attention mask) spreads to the rest of the image.
    """
    import torch

    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        transformer.proj_out.weight.mul_(4.0)
        for block in transformer.transformer_blocks:
            attn = block.attn
            attn.to_out.weight.mul_(4.0)
            attn.to_add_out.weight.mul_(4.0)
            bias = 3.0 * torch.randn(attn.kv_heads, attn.heads // attn.kv_heads, attn.head_dim, generator=generator)
            bias[:, 1:] = bias[:, :1]  # every query head of a group shares its key/value head's bias
            attn.to_q.bias.copy_(bias.flatten())
            attn.to_k.bias.copy_(bias[:, 0].flatten())


def build_tinymm(seed: int = 0):
    """TinyMMPipeline (examples/tinymm, not in diffusers): 4 joint blocks, 4 query and 2 key/value heads x 16,
    2-D RoPE, a text padding mask; T5 text encoder, AutoencoderKL."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from ditgate.core.examples import ensure_importable

    ensure_importable("tinymm")
    from tinymm import TinyMMPipeline, TinyMMTransformer2DModel

    d_text = 32
    transformer = _seeded(seed, lambda: TinyMMTransformer2DModel(
        in_channels=4, patch_size=2, num_layers=4, num_attention_heads=4, num_key_value_heads=2,
        attention_head_dim=16, text_dim=d_text))
    _tinymm_trained_like(transformer, seed)
    t5 = _t5(seed + 1, d_text)
    vae = _kl_vae(seed + 2, shift_factor=0.0, scaling_factor=1.0)
    return TinyMMPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=t5,
                          tokenizer=t5_tokenizer(), transformer=transformer)


def _example_pipeline(package: str, pipeline: str, transformer: str, seed: int, components: dict | None = None,
                      **config):
    """A pipeline of an example package (T5 text encoder, AutoencoderKL, Euler flow scheduler) with seeded weights."""
    import importlib

    from diffusers import FlowMatchEulerDiscreteScheduler

    from ditgate.core.examples import ensure_importable

    ensure_importable(package)
    module = importlib.import_module(package)
    model = _seeded(seed, lambda: getattr(module, transformer)(**config))
    return getattr(module, pipeline)(scheduler=FlowMatchEulerDiscreteScheduler(),
                                     vae=_kl_vae(seed + 2, shift_factor=0.0, scaling_factor=1.0),
                                     text_encoder=_t5(seed + 1, 32), tokenizer=t5_tokenizer(), transformer=model,
                                     **(components or {}))


def build_tinyst(seed: int = 0):
    """TinySTPipeline (examples/tinyst): 2 spatial + 2 temporal blocks interleaved, 4 heads x 8; T5, per-frame VAE."""
    return _example_pipeline("tinyst", "TinySTPipeline", "TinySTTransformer3DModel", seed, num_layers=2,
                             num_attention_heads=4, attention_head_dim=8, text_dim=32)


def build_tinymoe(seed: int = 0):
    """TinyMoEPipeline (examples/tinymoe): 2 blocks, 4 heads x 8, 4 packed experts of width 64; T5, AutoencoderKL."""
    return _example_pipeline("tinymoe", "TinyMoEPipeline", "TinyMoETransformer2DModel", seed, num_layers=2,
                             num_attention_heads=4, attention_head_dim=8, text_dim=32, num_experts=4, expert_dim=64)


def build_tinyav(seed: int = 0):
    """TinyAVPipeline (examples/tinyav): 2 fused video/audio blocks, 4 heads x 8; T5, per-frame VAE, a vocoder
    (8 audio channels, 256 samples per latent frame at 16 kHz: 31 frames make 0.5 s)."""
    from ditgate.core.examples import ensure_importable

    ensure_importable("tinyav")
    from tinyav import TinyAVVocoder

    vocoder = _seeded(seed + 3, lambda: TinyAVVocoder(in_channels=8, hidden=16, channels=2, hop_length=256,
                                                      sampling_rate=16000))
    return _example_pipeline("tinyav", "TinyAVPipeline", "TinyAVTransformer3DModel", seed,
                             {"vocoder": vocoder}, num_layers=2, num_attention_heads=4, attention_head_dim=8,
                             text_dim=32, audio_channels=8)


def build_stable_audio(seed: int = 0):
    """StableAudioPipeline: 4 blocks, 8 query / 4 key-value heads x 8, T5 encoder, Oobleck VAE, EDM DPM-Solver.

    The window is fixed (`sample_size` 31 latent frames of 512 samples at 44.1 kHz, 0.36 s); the global token the
    transformer prepends makes 32 block tokens, which split over 2 or 4 ranks. The scheduler is the deterministic
    (ODE) DPM-Solver++ with Stable Audio's EDM settings: the released model's SDE scheduler needs `torchsde`.
    """
    from diffusers import AutoencoderOobleck, EDMDPMSolverMultistepScheduler, StableAudioDiTModel, StableAudioPipeline
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel

    d_text = 32
    transformer = _seeded(seed, lambda: StableAudioDiTModel(
        sample_size=31, in_channels=8, out_channels=8, num_layers=4, attention_head_dim=8, num_attention_heads=8,
        num_key_value_attention_heads=4, cross_attention_dim=32, time_proj_dim=32,
        global_states_input_dim=2 * d_text, cross_attention_input_dim=d_text))
    t5 = _t5(seed + 1, d_text)
    projection = _seeded(seed + 2, lambda: StableAudioProjectionModel(
        text_encoder_dim=d_text, conditioning_dim=d_text, min_value=0, max_value=4))
    vae = _seeded(seed + 3, lambda: AutoencoderOobleck(
        encoder_hidden_size=8, downsampling_ratios=[2, 4, 8, 8], channel_multiples=[1, 2, 4, 4], decoder_channels=8,
        decoder_input_channels=8, audio_channels=2, sampling_rate=44100))
    scheduler = EDMDPMSolverMultistepScheduler(
        sigma_min=0.3, sigma_max=500.0, sigma_data=1.0, sigma_schedule="exponential", prediction_type="v_prediction",
        solver_order=2, algorithm_type="dpmsolver++")
    return StableAudioPipeline(vae=vae, text_encoder=t5, projection_model=projection, tokenizer=t5_tokenizer(32),
                               transformer=transformer, scheduler=scheduler)
