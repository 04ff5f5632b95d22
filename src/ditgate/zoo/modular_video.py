"""Seeded builders of tiny modular-only video pipelines (diffusers `ModularPipeline`s with no standard class).

Cosmos 3 distilled (`Cosmos3DistilledModularPipeline`): the blocks run no text encoder; the joint
`Cosmos3OmniTransformer` embeds the prompt's token ids itself (a causal "understanding" stream of text tokens and a
"generation" stream of vision tokens in every layer). The folder differs from a released one in two config entries
of its `modular_model_index.json`:
- `enable_safety_checker` is false. The blocks refuse to run while it is true and no `safety_checker` is set
  (diffusers modular_pipelines/cosmos/encoders.py, `Cosmos3DistilledTextEncoderStep.__call__`), and the checker
  (`CosmosSafetyChecker`, the Cosmos Guardrail models) cannot be built offline. `ModularPipeline.from_pretrained`
  reads config entries from the index (modular_pipeline.py, `elif name in self._config_specs`), so a loaded folder
  runs with no loader option.
- `distilled_sigmas` holds the tiny model's own fixed schedule (a released distilled checkpoint ships its own):
  the blocks' step count is its length and `num_inference_steps` must equal it.
"""

from __future__ import annotations

from ditgate.zoo.builders import _seeded
from ditgate.zoo.tokenizers import qwen2_tokenizer

# The Qwen chat template the blocks' tokenize_prompt applies (system + user, then the assistant turn).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
COSMOS3_SIGMAS = [1.0, 0.85, 0.65, 0.4]  # 4 distilled steps
COSMOS3_CONFIG = {"enable_safety_checker": False, "distilled_sigmas": COSMOS3_SIGMAS}


def _cosmos_tokenizer():
    tokenizer = qwen2_tokenizer()  # its special tokens hold <|vision_start|>: the blocks' start-of-generation token
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_cosmos3_distilled(seed: int = 0):
    """Cosmos3DistilledModularPipeline: a 2-layer Cosmos3OmniTransformer (hidden 64, 8 query / 4 KV heads x 16,
    mRoPE axes 4+2+2), a 3-level AutoencoderKLWan (z 16, 8x spatial, 4x temporal), the byte-level Qwen2 tokenizer
    with a chat template, a FlowMatchEulerDiscreteScheduler. Guidance is distilled: one transformer call per step.
    The safety checker is off and the schedule set in the pipeline config (module docstring)."""
    import diffusers
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, FlowMatchEulerDiscreteScheduler

    tokenizer = _cosmos_tokenizer()
    latent_channels = 16
    transformer = _seeded(seed, lambda: Cosmos3OmniTransformer(
        head_dim=16, hidden_size=64, intermediate_size=128, latent_channel=latent_channels, latent_patch_size=2,
        num_attention_heads=8, num_hidden_layers=2, num_key_value_heads=4, patch_latent_dim=latent_channels * 4,
        rope_axes_dim=[4, 2, 2], vocab_size=len(tokenizer) + 8, dtype="float32"))
    vae = _seeded(seed + 1, lambda: AutoencoderKLWan(
        base_dim=8, z_dim=latent_channels, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True]))
    pipe = diffusers.Cosmos3DistilledModularPipeline()
    pipe.update_components(transformer=transformer, vae=vae, text_tokenizer=tokenizer,
                           scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.register_to_config(**COSMOS3_CONFIG)
    return pipe
