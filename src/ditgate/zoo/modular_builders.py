"""Seeded builders of tiny diffusers `ModularPipeline`s that have no standard pipeline class.

A builder returns a `ModularPipeline` whose components are set; `save_pretrained` then writes the folder with its
`modular_model_index.json`, and `ModularPipeline.from_pretrained(folder)` + `load_components()` load it back like a
released modular model.

FLUX.3 departs from the released layout in one place: its `tokenizer` and `prompt_upsampler_processor` components
are `transformers.LlavaProcessor`s (a byte-level Qwen2 tokenizer with a chat template and a PIL image processor)
instead of Qwen3-VL / Qwen3.5 processors, whose video processor needs torchvision. The blocks use only the chat
template and the tokenizer of that processor, so the text path is the released one.
"""

from __future__ import annotations

from ditgate.zoo.builders import _seeded
from ditgate.zoo.tokenizers import QWEN_SPECIAL_TOKENS, qwen2_tokenizer

# Enough of the Qwen chat template for text-only messages (string content or a list of text parts).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FLUX3_TEXT_LAYERS = (1, 2)  # hidden layers of the 2-layer text encoder stacked into the prompt embeddings
FLUX3_TEXT_WIDTH = 32


def chat_processor():
    """A LlavaProcessor (byte-level Qwen2 tokenizer, text-only chat template, PIL image processor): loads without
    torchvision, so it also stands in for a processor whose own class needs it (the twin's stand-ins)."""
    from transformers import LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # transformers releases without the PIL-only class
        from transformers import CLIPImageProcessor as ImageProcessor
    return LlavaProcessor(image_processor=ImageProcessor(), tokenizer=qwen2_tokenizer(), chat_template=CHAT_TEMPLATE,
                          image_token="<|image_pad|>", patch_size=14, num_additional_image_tokens=0)


def _qwen_ids() -> tuple[int, dict[str, int]]:
    tokenizer = qwen2_tokenizer()
    return len(tokenizer) + 8, {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN_SPECIAL_TOKENS}


def _qwen3_vl(seed: int):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    vocab_size, ids = _qwen_ids()
    config = Qwen3VLConfig(
        text_config={"hidden_size": FLUX3_TEXT_WIDTH, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": vocab_size,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": FLUX3_TEXT_WIDTH, "deepstack_visual_indexes": []},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|image_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    return _seeded(seed, lambda: Qwen3VLForConditionalGeneration(config))


def _qwen3_5(seed: int):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vocab_size, ids = _qwen_ids()
    config = Qwen3_5Config(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 8, "vocab_size": vocab_size,
                     "layer_types": ["full_attention", "full_attention"],
                     "eos_token_id": ids["<|im_end|>"], "pad_token_id": 0},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": 32},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|image_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    model = _seeded(seed, lambda: Qwen3_5ForConditionalGeneration(config))
    model.generation_config.eos_token_id = None  # a random model must not stop at once: the caption may not be empty
    model.generation_config.pad_token_id = 0
    return model


def build_flux3(seed: int = 0, distilled: bool = False):
    """Flux3ModularPipeline (or Flux3DistilledModularPipeline): 1 per-mode + 2 joint blocks, 4 heads x 16; a 2-layer
    Qwen3-VL text encoder, a 2-layer Qwen3.5 prompt upsampler, a 2-level AutoencoderKLFlux2. The scheduler and
    the guider are the blocks' own, created from their configs (diffusers saves neither): FLUX.3's flow-match
    schedule (shift 6.93) and ClassifierFreeGuidance at scale 3.5, two calls per step."""
    import diffusers
    from diffusers import AutoencoderKLFlux2, Flux3Transformer2DModel

    latent_channels = 4
    transformer = _seeded(seed, lambda: Flux3Transformer2DModel(
        in_channels=latent_channels * 4, cond_in_channels=latent_channels * 4, num_layers=1, num_single_layers=2,
        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=FLUX3_TEXT_WIDTH * len(FLUX3_TEXT_LAYERS),
        timestep_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4), flow_map=distilled))
    vae = _seeded(seed + 3, lambda: AutoencoderKLFlux2(
        block_out_channels=(8, 16), down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2, layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=4, sample_size=32, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=False))
    cls = diffusers.Flux3DistilledModularPipeline if distilled else diffusers.Flux3ModularPipeline
    pipe = cls()
    components = dict(transformer=transformer, vae=vae, text_encoder=_qwen3_vl(seed + 1), tokenizer=chat_processor(),
                      prompt_upsampler=_qwen3_5(seed + 2), prompt_upsampler_processor=chat_processor())
    pipe.update_components(**{k: v for k, v in components.items() if k in pipe._component_specs})
    return pipe
