"""Tiny video pipelines on Wan-style blocks and their kin: Wan 2.2 (two transformers), Helios, AnyFlow, ChronoEdit
(image edit through frames), EasyAnimate, HunyuanVideo 1.5.

Same conventions as `video`: 4 heads, text width 32, the smallest frame counts the causal VAEs take.
"""

from __future__ import annotations

from ditgate.zoo.builders import _seeded
from ditgate.zoo.pipelines import encoders as enc
from ditgate.zoo.pipelines.spec import PipelineSpec
from ditgate.zoo.pipelines.spec import video_call as _video
from ditgate.zoo.pipelines.video import _wan_transformer, _wan_vae


def build_wan22(seed: int = 0):
    """WanPipeline with Wan 2.2's two experts: `transformer` for the high-noise steps, `transformer_2` after the
    boundary; UMT5; UniPC flow scheduler."""
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    return WanPipeline(transformer=_wan_transformer(WanTransformer3DModel, seed),
                       transformer_2=_wan_transformer(WanTransformer3DModel, seed + 5), vae=_wan_vae(seed + 2),
                       scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                         flow_shift=3.0),
                       text_encoder=enc.umt5(seed + 1), tokenizer=enc.t5_tokenizer(), boundary_ratio=0.875)


def build_hunyuanvideo15(seed: int = 0):
    """HunyuanVideo15Pipeline: single-stream-free dual blocks with a token refiner; Qwen2.5-VL text + byT5 glyph
    encoder; a CFG guider."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline, \
        HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import T5Config, T5EncoderModel

    transformer = _seeded(seed, lambda: HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=4, attention_head_dim=16, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=32,
        image_embed_dim=16, rope_axes_dim=(4, 6, 6), target_size=16, task_type="t2v"))
    vae = _seeded(seed + 3, lambda: AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
        spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
        upsample_match_channel=False))
    byt5 = _seeded(seed + 2, lambda: T5EncoderModel(T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8, vocab_size=256)))
    return HunyuanVideo15Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=enc.qwen25vl_text(seed + 1), tokenizer=enc.llm_tokenizer("qwen2"),
        text_encoder_2=byt5, tokenizer_2=enc.byt5_tokenizer(), guider=ClassifierFreeGuidance(guidance_scale=4.0))


def build_helios(seed: int = 0):
    """HeliosPipeline: Wan-style blocks with multi-term history memory patches; UMT5; Helios stage scheduler."""
    from diffusers import HeliosPipeline, HeliosScheduler, HeliosTransformer3DModel

    transformer = _seeded(seed, lambda: HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_dim=(4, 4, 4), has_multi_term_memory_patch=True, guidance_cross_attn=True, zero_history_timestep=True,
        is_amplify_history=False))
    return HeliosPipeline(transformer=transformer, vae=_wan_vae(seed + 2),
                          scheduler=HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True),
                          text_encoder=enc.umt5(seed + 1), tokenizer=enc.t5_tokenizer())


def build_anyflow(seed: int = 0):
    """AnyFlowPipeline: Wan-style blocks with a flow-map time embedding (two timesteps); T5; flow-map Euler."""
    from diffusers import AnyFlowPipeline, AnyFlowTransformer3DModel, FlowMapEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: AnyFlowTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
        gate_value=0.25, deltatime_type="r"))
    return AnyFlowPipeline(transformer=transformer, vae=_wan_vae(seed + 2),
                           scheduler=FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
                           text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer())


def build_chronoedit(seed: int = 0):
    """ChronoEditPipeline: Wan I2V blocks (36 channels in, CLIP vision tokens) editing an image through frames."""
    from diffusers import ChronoEditPipeline, ChronoEditTransformer3DModel, FlowMatchEulerDiscreteScheduler
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    image_encoder = _seeded(seed + 3, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=16, projection_dim=16, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        intermediate_size=32, patch_size=8)))
    return ChronoEditPipeline(
        transformer=_wan_transformer(ChronoEditTransformer3DModel, seed, in_channels=36, image_dim=16),
        vae=_wan_vae(seed + 2), scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder=enc.umt5(seed + 1),
        tokenizer=enc.t5_tokenizer(), image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32))


def build_easyanimate(seed: int = 0):
    """EasyAnimatePipeline: joint text+video blocks; Qwen2-VL encoder through a chat template; MagViT VAE."""
    from diffusers import AutoencoderKLMagvit, EasyAnimatePipeline, EasyAnimateTransformer3DModel, \
        FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: EasyAnimateTransformer3DModel(
        num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=16,
        text_embed_dim=32, num_layers=2, sample_width=16, sample_height=16, patch_size=2))
    vae = _seeded(seed + 2, lambda: AutoencoderKLMagvit(
        in_channels=3, out_channels=3,
        down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
        up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3, block_out_channels=(8, 8, 8, 8),
        latent_channels=4, layers_per_block=1, norm_num_groups=2, spatial_group_norm=False))
    return EasyAnimatePipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                               text_encoder=enc.qwen2vl(seed + 1), tokenizer=enc.llm_tokenizer("qwen2"))


SPECS = [
    PipelineSpec("wan22", "WanPipeline", "video",
                 "Wan 2.2 T2V (A14B layout): two 2-block transformers split at the boundary step; UMT5; 5 frames of "
                 "32x32 -> 2 x 64 tokens", build_wan22,
                 _video(5, steps=16, guidance_scale=4.0, guidance_scale_2=3.0, negative_prompt="blurry",
                        max_sequence_length=16)),
    PipelineSpec("hunyuanvideo15", "HunyuanVideo15Pipeline", "video",
                 "HunyuanVideo 1.5 T2V: dual-stream blocks + token refiner; Qwen2.5-VL + byT5; CFG guider; 5 frames of "
                 "32x32", build_hunyuanvideo15, _video(5)),
    PipelineSpec("helios", "HeliosPipeline", "video",
                 "Helios: Wan-style blocks with history memory patches; UMT5; 9 frames of 32x32", build_helios,
                 _video(9, guidance_scale=5.0, negative_prompt="blurry", max_sequence_length=16)),
    PipelineSpec("anyflow", "AnyFlowPipeline", "video",
                 "AnyFlow: Wan-style blocks, flow-map time embedding; T5; 13 frames of 32x32 (4 latent frames: its "
                 "CP splits frames)", build_anyflow,
                 _video(13, guidance_scale=5.0, negative_prompt="blurry", max_sequence_length=16)),
    PipelineSpec("chronoedit", "ChronoEditPipeline", "video",
                 "ChronoEdit: Wan I2V blocks editing an image through 5 frames; UMT5 + CLIP vision", build_chronoedit,
                 _video(5, guidance_scale=5.0, negative_prompt="blurry", max_sequence_length=16), image=True),
    PipelineSpec("easyanimate", "EasyAnimatePipeline", "video",
                 "EasyAnimate V5: joint text+video blocks; Qwen2-VL; MagViT VAE; 5 frames of 32x32", build_easyanimate,
                 _video(5, guidance_scale=5.0, negative_prompt="blurry")),
]
