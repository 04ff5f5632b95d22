"""Tiny image pipelines with cross-attention, single-stream and refiner-block DiTs (PixArt, Sana, CogView, Lumina,
Hunyuan-DiT, Z-Image, Ovis, HunyuanImage, LongCat, Qwen-Image-Edit, DiT).

Same conventions as `image_mmdit`: 4 heads, text width 32, 32x32 images, seeded weights, eval mode.
"""

from __future__ import annotations

import torch

from ditgate.zoo.builders import _seeded, qwen_image_transformer_and_vae
from ditgate.zoo.pipelines import encoders as enc
from ditgate.zoo.pipelines.image_mmdit import kl_vae
from ditgate.zoo.pipelines.spec import PipelineSpec
from ditgate.zoo.pipelines.spec import image_call as _image


def _pixart(seed: int, sigma: bool):
    from diffusers import DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtSigmaPipeline, \
        PixArtTransformer2DModel

    transformer = _seeded(seed, lambda: PixArtTransformer2DModel(
        # alpha's size embedding takes a third of the width: 4 heads x 24
        sample_size=16 if sigma else 128, num_layers=2, patch_size=2, attention_head_dim=16 if sigma else 24,
        num_attention_heads=4, caption_channels=32, in_channels=4, cross_attention_dim=64 if sigma else 96,
        out_channels=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
        norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6, interpolation_scale=1))
    cls = PixArtSigmaPipeline if sigma else PixArtAlphaPipeline
    return cls(transformer=transformer, vae=kl_vae(seed + 2, scale=0.18215), scheduler=DPMSolverMultistepScheduler(),
               text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer())


def build_pixart_alpha(seed: int = 0):
    """PixArtAlphaPipeline: cross-attention blocks, AdaLN-single, resolution/aspect conditioning; T5."""
    return _pixart(seed, sigma=False)


def build_pixart_sigma(seed: int = 0):
    """PixArtSigmaPipeline: PixArt blocks without the size conditioning; T5."""
    return _pixart(seed, sigma=True)


def build_sana(seed: int = 0):
    """SanaPipeline: linear-attention blocks with cross-attention; Gemma2 encoder; DC-AE (32x compression here 2x)."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel

    transformer = _seeded(seed, lambda: SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=2, num_attention_heads=4, attention_head_dim=8,
        num_cross_attention_heads=4, cross_attention_head_dim=8, cross_attention_dim=32, caption_channels=32,
        sample_size=16))
    vae = _seeded(seed + 2, lambda: AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1], downsample_block_type="conv",
        upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
        scaling_factor=0.41407))
    return SanaPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                        text_encoder=enc.gemma2(seed + 1), tokenizer=enc.llm_tokenizer("gemma"))


def build_cogview3plus(seed: int = 0):
    """CogView3PlusPipeline: joint-sequence blocks with AdaLN; T5; CogVideoX DDIM scheduler."""
    from diffusers import CogVideoXDDIMScheduler, CogView3PlusPipeline, CogView3PlusTransformer2DModel

    transformer = _seeded(seed, lambda: CogView3PlusTransformer2DModel(
        patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4, out_channels=4,
        text_embed_dim=32, time_embed_dim=16, condition_dim=4, pos_embed_max_size=32, sample_size=16))
    return CogView3PlusPipeline(transformer=transformer, vae=kl_vae(seed + 2), scheduler=CogVideoXDDIMScheduler(),
                                text_encoder=enc.t5(seed + 1), tokenizer=enc.t5_tokenizer())


def build_cogview4(seed: int = 0):
    """CogView4Pipeline: joint-sequence blocks; GLM encoder; separate CFG calls."""
    from diffusers import CogView4Pipeline, CogView4Transformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: CogView4Transformer2DModel(
        patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4, out_channels=4,
        text_embed_dim=32, time_embed_dim=16, condition_dim=4))
    scheduler = FlowMatchEulerDiscreteScheduler(base_shift=0.25, max_shift=0.75, base_image_seq_len=256,
                                                use_dynamic_shifting=True, time_shift_type="linear")
    return CogView4Pipeline(transformer=transformer, vae=kl_vae(seed + 2), scheduler=scheduler,
                            text_encoder=enc.glm(seed + 1), tokenizer=enc.llm_tokenizer("llama", chat=False))


def build_hunyuandit(seed: int = 0):
    """HunyuanDiTPipeline: U-shaped skip-connected blocks with cross-attention; BERT + T5 (mT5 in the release)."""
    from diffusers import DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline

    transformer = _seeded(seed, lambda: HunyuanDiT2DModel(
        sample_size=16, num_layers=4, patch_size=2, attention_head_dim=16, num_attention_heads=4, in_channels=4,
        cross_attention_dim=32, cross_attention_dim_t5=32, pooled_projection_dim=16, hidden_size=64,
        text_len=77, text_len_t5=256, activation_fn="gelu-approximate"))
    # the pipeline sizes its RoPE grid for an 8x VAE: a 4-level VAE
    return HunyuanDiTPipeline(transformer=transformer, vae=kl_vae(seed + 3, scale=0.13025, levels=4),
                              scheduler=DDPMScheduler(), text_encoder=enc.bert(seed + 1),
                              tokenizer=enc.bert_tokenizer(),
                              text_encoder_2=enc.t5(seed + 2), tokenizer_2=enc.t5_tokenizer(), safety_checker=None,
                              feature_extractor=None, requires_safety_checker=False)


def build_lumina2(seed: int = 0):
    """Lumina2Pipeline: noise and context refiners, then joint single-stream blocks; Gemma2; separate CFG."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    transformer = _seeded(seed, lambda: Lumina2Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, hidden_size=64, num_layers=2, num_refiner_layers=1,
        num_attention_heads=4, num_kv_heads=4, multiple_of=16, norm_eps=1e-5, axes_dim_rope=[8, 4, 4],
        axes_lens=[300, 32, 32], cap_feat_dim=32))
    # the pipeline takes the VAE to downsample 8x: a 4-level VAE
    return Lumina2Pipeline(transformer=transformer, vae=kl_vae(seed + 2, shift=0.06, scale=1.5, levels=4),
                           scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=enc.gemma2(seed + 1),
                           tokenizer=enc.llm_tokenizer("gemma"))


def build_dit(seed: int = 0):
    """DiTPipeline: class-conditional DiT-XL layout (AdaLN-zero blocks), no text encoder; batched CFG."""
    from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    transformer = _seeded(seed, lambda: DiTTransformer2DModel(
        sample_size=16, num_layers=2, patch_size=2, attention_head_dim=16, num_attention_heads=4, in_channels=4,
        out_channels=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
        norm_type="ada_norm_zero", norm_elementwise_affine=False))
    return DiTPipeline(transformer=transformer, vae=kl_vae(seed + 1, scale=0.18215), scheduler=DDIMScheduler(),
                       id2label={0: "cube", 1: "sphere"})


def build_zimage(seed: int = 0):
    """ZImagePipeline: noise/context refiners then single-stream blocks over a padded joint sequence; Qwen3."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    transformer = _seeded(seed, lambda: ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=64, n_layers=2, n_refiner_layers=1, n_heads=4,
        n_kv_heads=4, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[8, 4, 4], axes_lens=[256, 32, 32]))
    with torch.no_grad():  # both pad tokens start as torch.empty
        transformer.x_pad_token.fill_(1.0)
        transformer.cap_pad_token.fill_(1.0)
    return ZImagePipeline(transformer=transformer, vae=kl_vae(seed + 2, shift=0.1159, scale=0.3611),
                          scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=enc.qwen3(seed + 1),
                          tokenizer=enc.llm_tokenizer("qwen2"))


def build_ovis(seed: int = 0):
    """OvisImagePipeline: Flux-like double + single blocks; Qwen3 encoder through a chat template."""
    from diffusers import FlowMatchEulerDiscreteScheduler, OvisImagePipeline, OvisImageTransformer2DModel

    transformer = _seeded(seed, lambda: OvisImageTransformer2DModel(
        patch_size=1, in_channels=16, out_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, axes_dims_rope=(4, 4, 8)))
    return OvisImagePipeline(transformer=transformer, vae=kl_vae(seed + 2, shift=0.06, scale=1.5),
                             scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=enc.qwen3(seed + 1),
                             tokenizer=enc.llm_tokenizer("qwen2"))


def build_longcat(seed: int = 0):
    """LongCatImagePipeline: Flux-like blocks; Qwen2.5-VL encoder."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LongCatImagePipeline, LongCatImageTransformer2DModel

    transformer = _seeded(seed, lambda: LongCatImageTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]))
    return LongCatImagePipeline(transformer=transformer, vae=kl_vae(seed + 2, shift=0.06, scale=1.5),
                                scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=enc.qwen25vl(seed + 1),
                                tokenizer=enc.llm_tokenizer("qwen2"), text_processor=_qwen_processor())


def build_hunyuanimage(seed: int = 0):
    """HunyuanImagePipeline (2.1): double + single blocks with refiner; Qwen2.5-VL + byT5; adaptive guiders."""
    from diffusers import AutoencoderKLHunyuanImage, FlowMatchEulerDiscreteScheduler, HunyuanImagePipeline, \
        HunyuanImageTransformer2DModel
    from diffusers.guiders import AdaptiveProjectedMixGuidance

    transformer = _seeded(seed, lambda: HunyuanImageTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=16, num_layers=2,
        num_single_layers=2, num_refiner_layers=1, patch_size=(1, 1), guidance_embeds=False, text_embed_dim=32,
        text_embed_2_dim=32, rope_axes_dim=(8, 8)))
    vae = _seeded(seed + 3, lambda: AutoencoderKLHunyuanImage(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        scaling_factor=0.476986, spatial_compression_ratio=2, sample_size=32))
    from transformers import T5Config, T5EncoderModel

    byt5 = _seeded(seed + 2, lambda: T5EncoderModel(T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8, vocab_size=256,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)))
    return HunyuanImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder=enc.qwen25vl(seed + 1), tokenizer=enc.llm_tokenizer("qwen2"), text_encoder_2=byt5,
        tokenizer_2=enc.byt5_tokenizer(), guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=2),
        ocr_guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=3))


def _qwen_processor():
    """A Qwen2-VL processor (image processor + the tiny Qwen2 tokenizer) for the VL text encoders."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor

    tokenizer = enc.llm_tokenizer("qwen2")
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=56 * 56),
                            tokenizer=tokenizer, chat_template=enc.CHAT_TEMPLATE)


def _qwen_image_parts(seed: int) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler

    transformer, vae = qwen_image_transformer_and_vae(seed)
    return {"scheduler": FlowMatchEulerDiscreteScheduler(), "vae": vae, "text_encoder": enc.qwen25vl(seed + 1),
            "tokenizer": enc.llm_tokenizer("qwen2"), "transformer": transformer}


def build_qwen_image_img2img(seed: int = 0):
    """QwenImageImg2ImgPipeline: the zoo's Qwen-Image layout, denoising from the input image's noised latents."""
    from diffusers import QwenImageImg2ImgPipeline

    return QwenImageImg2ImgPipeline(**_qwen_image_parts(seed))


def build_qwen_image_edit(seed: int = 0):
    """QwenImageEditPipeline: the zoo's Qwen-Image layout, the input image's latents appended to the sequence and
    the image through the Qwen2.5-VL vision tower; true CFG."""
    from diffusers import QwenImageEditPipeline

    return QwenImageEditPipeline(processor=_qwen_processor(), **_qwen_image_parts(seed))



SPECS = [
    PipelineSpec("pixart-alpha", "PixArtAlphaPipeline", "image",
                 "PixArt-alpha: 2 cross-attention blocks, AdaLN-single, size conditioning; T5; batched CFG",
                 build_pixart_alpha, _image(guidance_scale=4.5, max_sequence_length=32, use_resolution_binning=False)),
    PipelineSpec("pixart-sigma", "PixArtSigmaPipeline", "image", "PixArt-sigma: PixArt blocks; T5; batched CFG",
                 build_pixart_sigma, _image(guidance_scale=4.5, max_sequence_length=32, use_resolution_binning=False)),
    PipelineSpec("sana", "SanaPipeline", "image", "Sana: linear attention + cross-attention; Gemma2; DC-AE",
                 build_sana, _image(guidance_scale=4.5, max_sequence_length=32, use_resolution_binning=False,
                                    complex_human_instruction=None)),
    PipelineSpec("cogview3plus", "CogView3PlusPipeline", "image", "CogView3-Plus: joint-sequence AdaLN blocks; T5",
                 build_cogview3plus, _image(guidance_scale=5.0, max_sequence_length=32)),
    PipelineSpec("cogview4", "CogView4Pipeline", "image", "CogView4: joint-sequence blocks; GLM; separate CFG calls",
                 build_cogview4, _image(guidance_scale=5.0, max_sequence_length=32, negative_prompt="blurry")),
    PipelineSpec("hunyuandit", "HunyuanDiTPipeline", "image",
                 "Hunyuan-DiT: 4 U-skip blocks with cross-attention; BERT + T5; batched CFG", build_hunyuandit,
                 _image(size=128, guidance_scale=5.0, use_resolution_binning=False)),
    PipelineSpec("lumina2", "Lumina2Pipeline", "image",
                 "Lumina-Image 2.0: refiners then joint single-stream blocks; Gemma2; separate CFG calls",
                 build_lumina2, _image(size=128, guidance_scale=4.0, max_sequence_length=32, system_prompt="")),
    PipelineSpec("dit", "DiTPipeline", "image", "DiT: class-conditional AdaLN-zero blocks, no text; batched CFG",
                 build_dit, {"class_labels": [0], "num_inference_steps": 6, "guidance_scale": 4.0}),
    PipelineSpec("zimage", "ZImagePipeline", "image",
                 "Z-Image: refiners then single-stream blocks over a padded joint sequence; Qwen3",
                 build_zimage, _image(guidance_scale=3.0, max_sequence_length=32)),
    PipelineSpec("ovis", "OvisImagePipeline", "image", "Ovis-Image: Flux-like blocks; Qwen3 via a chat template",
                 build_ovis, _image(guidance_scale=4.0, max_sequence_length=32)),
    PipelineSpec("longcat", "LongCatImagePipeline", "image", "LongCat-Image: Flux-like blocks; Qwen2.5-VL",
                 build_longcat, _image(guidance_scale=4.0, enable_prompt_rewrite=False)),
    PipelineSpec("hunyuanimage", "HunyuanImagePipeline", "image",
                 "HunyuanImage 2.1: double + single blocks, token refiner; Qwen2.5-VL + byT5; adaptive guiders",
                 build_hunyuanimage, _image()),
    PipelineSpec("qwen-image-edit", "QwenImageEditPipeline", "image",
                 "Qwen-Image-Edit: 4 blocks; input image latents appended; Qwen2.5-VL sees the image; true CFG",
                 build_qwen_image_edit, _image(true_cfg_scale=2.0, negative_prompt="blurry"), image=True),
    PipelineSpec("qwen-image-img2img", "QwenImageImg2ImgPipeline", "image",
                 "Qwen-Image img2img: 4 blocks; denoises from the input image's latents (strength 0.8); true CFG",
                 build_qwen_image_img2img, _image(true_cfg_scale=2.0, negative_prompt="blurry", strength=0.8,
                                                  max_sequence_length=64), image=True),
]
