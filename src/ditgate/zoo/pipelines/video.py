"""Tiny video pipelines: Wan image-to-video, SkyReels-V2, HunyuanVideo, CogVideoX (T2V and I2V), Mochi, LTX (T2V and
I2V), Allegro.

4 heads, text width 32; frame counts and sizes are the smallest each VAE's compression accepts (a causal VAE takes
4k+1 frames); the sequence each makes is in its summary.
"""

from __future__ import annotations

from ditgate.zoo.builders import _seeded
from ditgate.zoo.pipelines import encoders as enc
from ditgate.zoo.pipelines.spec import PipelineSpec
from ditgate.zoo.pipelines.spec import video_call as _video


def _wan_vae(seed: int):
    from diffusers import AutoencoderKLWan

    return _seeded(seed, lambda: AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]))


def _wan_transformer(cls, seed: int, in_channels: int = 16, **extra):
    return _seeded(seed, lambda: cls(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=in_channels, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, **extra))


def build_wan_i2v(seed: int = 0):
    """WanImageToVideoPipeline (Wan 2.1 I2V): the first frame's latents and mask join the channels (36 in); a CLIP
    vision encoder's tokens join the cross-attention."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    image_encoder = _seeded(seed + 3, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=16, projection_dim=16, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        intermediate_size=32, patch_size=8)))
    return WanImageToVideoPipeline(
        transformer=_wan_transformer(WanTransformer3DModel, seed, in_channels=36, image_dim=16), vae=_wan_vae(seed + 2),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder=enc.umt5(seed + 1),
        tokenizer=enc.t5_tokenizer(), image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32), transformer_2=None)


def build_skyreels_v2(seed: int = 0):
    """SkyReelsV2Pipeline: Wan-style blocks; UMT5; UniPC flow scheduler; separate CFG calls."""
    from diffusers import SkyReelsV2Pipeline, SkyReelsV2Transformer3DModel, UniPCMultistepScheduler

    return SkyReelsV2Pipeline(transformer=_wan_transformer(SkyReelsV2Transformer3DModel, seed), vae=_wan_vae(seed + 2),
                              scheduler=UniPCMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True),
                              text_encoder=enc.umt5(seed + 1), tokenizer=enc.t5_tokenizer())


def build_hunyuanvideo(seed: int = 0):
    """HunyuanVideoPipeline: dual-stream then single-stream blocks, a token refiner; Llama + CLIP; embedded guidance."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, \
        HunyuanVideoTransformer3DModel

    transformer = _seeded(seed, lambda: HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=16, num_layers=2,
        num_single_layers=2, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=32, pooled_projection_dim=32, rope_axes_dim=(4, 6, 6)))
    vae = _seeded(seed + 3, lambda: AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True))
    return HunyuanVideoPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                text_encoder=enc.llama(seed + 1), tokenizer=enc.llm_tokenizer("llama", chat=False),
                                text_encoder_2=enc.clip(seed + 2), tokenizer_2=enc.clip_tokenizer())


def _cogvideox_vae(seed: int):
    from diffusers import AutoencoderKLCogVideoX

    return _seeded(seed, lambda: AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4))


def _cogvideox_transformer(seed: int, in_channels: int, **extra):
    from diffusers import CogVideoXTransformer3DModel

    return _seeded(seed, lambda: CogVideoXTransformer3DModel(
        num_attention_heads=4, attention_head_dim=16, in_channels=in_channels, out_channels=4, time_embed_dim=8,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=16, **extra))


def build_cogvideox(seed: int = 0):
    """CogVideoXPipeline: joint text+video blocks with expert AdaLN; T5; batched CFG."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline

    return CogVideoXPipeline(transformer=_cogvideox_transformer(seed, 4), vae=_cogvideox_vae(seed + 2),
                             scheduler=CogVideoXDDIMScheduler(), text_encoder=enc.t5(seed + 1),
                             tokenizer=enc.t5_tokenizer())


def build_cogvideox_i2v(seed: int = 0):
    """CogVideoXImageToVideoPipeline: the image's latents concatenated on channels (8 in), RoPE + learned positions."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXImageToVideoPipeline

    transformer = _cogvideox_transformer(seed, 8, use_rotary_positional_embeddings=True,
                                         use_learned_positional_embeddings=True)
    return CogVideoXImageToVideoPipeline(transformer=transformer, vae=_cogvideox_vae(seed + 2),
                                         scheduler=CogVideoXDDIMScheduler(), text_encoder=enc.t5(seed + 1),
                                         tokenizer=enc.t5_tokenizer())


def build_mochi(seed: int = 0):
    """MochiPipeline: asymmetric joint blocks (text stream narrower); T5; Mochi VAE."""
    from diffusers import AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

    transformer = _seeded(seed, lambda: MochiTransformer3DModel(
        # widths 96 (video) and 48 (text): SwiGLU widths 2 x 256 and 2 x 128 split over 2 TP ranks and 2 gates
        patch_size=2, num_attention_heads=4, attention_head_dim=24, num_layers=2, pooled_projection_dim=48,
        in_channels=12, out_channels=None, qk_norm="rms_norm", text_embed_dim=32, time_embed_dim=8,
        activation_fn="swiglu", max_sequence_length=32))
    vae = _seeded(seed + 2, lambda: AutoencoderKLMochi(
        latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1)))
    return MochiPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                         text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer())


def _ltx_parts(seed: int) -> dict:
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    transformer = _seeded(seed, lambda: LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=2, caption_channels=32))
    vae = _seeded(seed + 2, lambda: AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
        upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False))
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    return {"transformer": transformer, "vae": vae, "scheduler": FlowMatchEulerDiscreteScheduler(),
            "text_encoder": enc.t5(seed + 1), "tokenizer": enc.t5_tokenizer()}


def build_ltx(seed: int = 0):
    """LTXPipeline: packed video tokens through cross-attention blocks; T5; batched CFG."""
    from diffusers import LTXPipeline

    return LTXPipeline(**_ltx_parts(seed))


def build_ltx_i2v(seed: int = 0):
    """LTXImageToVideoPipeline: the first frame's latents fixed through a per-token timestep mask."""
    from diffusers import LTXImageToVideoPipeline

    return LTXImageToVideoPipeline(**_ltx_parts(seed))


def build_allegro(seed: int = 0):
    """AllegroPipeline: cross-attention blocks over 3-D patches; T5; Allegro VAE (tiled decode only)."""
    from diffusers import AllegroPipeline, AllegroTransformer3DModel, AutoencoderKLAllegro, DDIMScheduler

    transformer = _seeded(seed, lambda: AllegroTransformer3DModel(
        num_attention_heads=4, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=2,  # 3-D RoPE: 12
        cross_attention_dim=48, sample_width=8, sample_height=8, sample_frames=8, caption_channels=32))
    vae = _seeded(seed + 2, lambda: AutoencoderKLAllegro(
        in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 4,
        up_block_types=("AllegroUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4))
    vae.enable_tiling()  # diffusers' Allegro VAE decodes only tiled
    return AllegroPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler(), text_encoder=enc.t5(seed + 1),
                           tokenizer=enc.t5_tokenizer())


SPECS = [
    PipelineSpec("wan-i2v", "WanImageToVideoPipeline", "video",
                 "Wan 2.1 I2V: 2 blocks, 4 heads; UMT5 + CLIP vision; first-frame latents on channels; 5 frames of "
                 "32x32 -> 2 x 64 tokens", build_wan_i2v,
                 _video(5, guidance_scale=5.0, negative_prompt="blurry", max_sequence_length=16), image=True),
    PipelineSpec("skyreels-v2", "SkyReelsV2Pipeline", "video",
                 "SkyReels-V2 T2V: Wan-style blocks; UMT5; 5 frames of 32x32 -> 2 x 64 tokens", build_skyreels_v2,
                 _video(5, guidance_scale=5.0, negative_prompt="blurry", max_sequence_length=16)),
    PipelineSpec("hunyuanvideo", "HunyuanVideoPipeline", "video",
                 "HunyuanVideo: 2 dual + 2 single blocks, token refiner; Llama + CLIP; 5 frames of 64x64 -> 2 x 16 "
                 "tokens", build_hunyuanvideo,
                 _video(5, size=64, guidance_scale=6.0, max_sequence_length=32)),
    PipelineSpec("cogvideox", "CogVideoXPipeline", "video",
                 "CogVideoX T2V: 2 expert-AdaLN joint blocks; T5; 9 frames of 64x64 -> 3 x 16 tokens",
                 build_cogvideox, _video(9, size=64, guidance_scale=6.0, max_sequence_length=16)),
    PipelineSpec("cogvideox-i2v", "CogVideoXImageToVideoPipeline", "video",
                 "CogVideoX I2V: image latents on channels, RoPE + learned positions; 9 frames of 64x64",
                 build_cogvideox_i2v, _video(9, size=64, guidance_scale=6.0, max_sequence_length=16), image=True),
    PipelineSpec("mochi", "MochiPipeline", "video",
                 "Mochi: 2 asymmetric joint blocks; T5; 7 frames of 32x32 -> 2 x 4 tokens", build_mochi,
                 _video(7, guidance_scale=4.5, max_sequence_length=32)),
    PipelineSpec("ltx", "LTXPipeline", "video",
                 "LTX-Video: 2 cross-attention blocks over packed tokens; T5; 9 frames of 32x32 -> 3 x 64 tokens",
                 build_ltx, _video(9, guidance_scale=3.0, max_sequence_length=32, decode_timestep=0.0)),
    PipelineSpec("ltx-i2v", "LTXImageToVideoPipeline", "video",
                 "LTX-Video I2V: first frame held by a per-token timestep mask; 9 frames of 32x32", build_ltx_i2v,
                 _video(9, guidance_scale=3.0, max_sequence_length=32, decode_timestep=0.0), image=True),
    PipelineSpec("allegro", "AllegroPipeline", "video",
                 "Allegro: 2 cross-attention blocks over 3-D patches; T5; 8 frames of 32x32", build_allegro,
                 _video(8, guidance_scale=7.5, max_sequence_length=32)),
]
