"""TinyMoEPipeline: text-to-image with the TinyMoE transformer, a T5 text encoder and an AutoencoderKL.

Rectified flow with an Euler scheduler. Prompts are padded to `max_sequence_length` and the padding mask goes to
the transformer (`encoder_attention_mask`). Classifier-free guidance is batched: one transformer call per step on
`[negative, positive]`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from diffusers.image_processor import VaeImageProcessor
from diffusers.models import AutoencoderKL
from diffusers.pipelines.pipeline_utils import DiffusionPipeline, ImagePipelineOutput
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor
from transformers import T5EncoderModel, T5Tokenizer

from .transformer_tinymoe import TinyMoETransformer2DModel


class TinyMoEPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, scheduler: FlowMatchEulerDiscreteScheduler, vae: AutoencoderKL,
                 text_encoder: T5EncoderModel, tokenizer: T5Tokenizer, transformer: TinyMoETransformer2DModel):
        super().__init__()
        self.register_modules(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)

    def save_pretrained(self, save_directory, **kwargs):
        """As diffusers', but `model_index.json` names the package too: `"_class_name": ["tinymoe", "TinyMoEPipeline"]`.

        diffusers writes the bare class name, which a loader looks up in diffusers; the pair tells it what to import.
        `TinyMoEPipeline.from_pretrained` reads either form.
        """
        super().save_pretrained(save_directory, **kwargs)
        index_file = Path(save_directory) / "model_index.json"
        index = json.loads(index_file.read_text())
        index["_class_name"] = [type(self).__module__.split(".")[0], type(self).__name__]
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def encode_prompt(self, prompts: list[str], max_sequence_length: int, device: torch.device):
        """(embeddings [B, L, text_dim], padding mask [B, L]) of `prompts`, padded to `max_sequence_length`."""
        tokens = self.tokenizer(prompts, padding="max_length", max_length=max_sequence_length, truncation=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        embeds = self.text_encoder(ids, attention_mask=mask).last_hidden_state
        return embeds.to(self.transformer.dtype), mask

    @torch.no_grad()
    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None, height: int = 64,
                 width: int = 64, num_inference_steps: int = 8, guidance_scale: float = 4.0,
                 generator: torch.Generator | None = None, latents: torch.Tensor | None = None,
                 max_sequence_length: int = 64, output_type: str = "pil", return_dict: bool = True,
                 callback_on_step_end: Callable[..., dict[str, Any]] | None = None,
                 callback_on_step_end_tensor_inputs: list[str] | None = None):
        device = self._execution_device
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        batch = len(prompts)
        cfg = guidance_scale > 1.0
        embeds, mask = self.encode_prompt(prompts, max_sequence_length, device)
        if cfg:
            negative = negative_prompt if negative_prompt is not None else ""
            negatives = [negative] * batch if isinstance(negative, str) else list(negative)
            neg_embeds, neg_mask = self.encode_prompt(negatives, max_sequence_length, device)
            embeds, mask = torch.cat([neg_embeds, embeds]), torch.cat([neg_mask, mask])

        channels = self.transformer.config.in_channels
        shape = (batch, channels, height // self.vae_scale_factor, width // self.vae_scale_factor)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=self.transformer.dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        for i, t in enumerate(self.scheduler.timesteps):
            model_input = torch.cat([latents] * 2) if cfg else latents
            velocity = self.transformer(hidden_states=model_input, encoder_hidden_states=embeds,
                                        timestep=t.expand(model_input.shape[0]), encoder_attention_mask=mask,
                                        return_dict=False)[0]
            if cfg:
                uncond, cond = velocity.chunk(2)
                velocity = uncond + guidance_scale * (cond - uncond)
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                available = {"latents": latents}
                values = callback_on_step_end(self, i, t, {name: available[name] for name in tensor_inputs})
                latents = values.get("latents", latents)

        if output_type == "latent":
            image = latents
        else:
            scaled = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
            image = self.vae.decode(scaled.to(self.vae.dtype), return_dict=False)[0]
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return ImagePipelineOutput(images=image)
