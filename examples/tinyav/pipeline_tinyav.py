"""TinyAVPipeline: text to video and audio with the TinyAV transformer, a T5 text encoder, a per-frame
AutoencoderKL for the frames and a small vocoder for the waveform.

Rectified flow: the scheduler steps the video latents, the audio latents take the same Euler step on the same
sigmas. Batched classifier-free guidance (one transformer call per step on `[negative, positive]`). The output has
both: `frames` (B, F, H, W, C) in [0, 1] and `audio` (B, channels, samples) at `vocoder.config.sampling_rate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.image_processor import VaeImageProcessor
from diffusers.models import AutoencoderKL
from diffusers.models.modeling_utils import ModelMixin
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from torch import nn
from transformers import T5EncoderModel, T5Tokenizer

from .transformer_tinyav import TinyAVTransformer3DModel


@dataclass
class TinyAVPipelineOutput(BaseOutput):
    frames: Any  # np.ndarray (B, F, H, W, C) in [0, 1]
    audio: Any  # np.ndarray (B, channels, samples) in [-1, 1]


class TinyAVVocoder(ModelMixin, ConfigMixin):
    """Audio latents (B, A, L) -> waveform (B, channels, L * hop_length)."""

    @register_to_config
    def __init__(self, in_channels: int = 8, hidden: int = 16, channels: int = 2, hop_length: int = 64,
                 sampling_rate: int = 16000):
        super().__init__()
        self.up = nn.ConvTranspose1d(in_channels, hidden, kernel_size=hop_length, stride=hop_length)
        self.out = nn.Conv1d(hidden, channels, kernel_size=5, padding=2)

    def forward(self, latents):
        return torch.tanh(self.out(torch.tanh(self.up(latents))))


class TinyAVPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->transformer->vae->vocoder"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, scheduler: FlowMatchEulerDiscreteScheduler, vae: AutoencoderKL, text_encoder: T5EncoderModel,
                 tokenizer: T5Tokenizer, transformer: TinyAVTransformer3DModel, vocoder: TinyAVVocoder):
        super().__init__()
        self.register_modules(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer, vocoder=vocoder)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)

    def save_pretrained(self, save_directory, **kwargs):
        """As diffusers', but `model_index.json` names the package too (`["tinyav", "TinyAVPipeline"]`)."""
        super().save_pretrained(save_directory, **kwargs)
        index_file = Path(save_directory) / "model_index.json"
        index = json.loads(index_file.read_text())
        index["_class_name"] = [type(self).__module__.split(".")[0], type(self).__name__]
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def encode_prompt(self, prompts: list[str], max_sequence_length: int, device):
        tokens = self.tokenizer(prompts, padding="max_length", max_length=max_sequence_length, truncation=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        return self.text_encoder(ids, attention_mask=mask).last_hidden_state.to(self.transformer.dtype)

    @torch.no_grad()
    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None, height: int = 16,
                 width: int = 16, num_frames: int = 4, audio_frames: int = 31, num_inference_steps: int = 8,
                 guidance_scale: float = 4.0, generator: torch.Generator | None = None, max_sequence_length: int = 16,
                 output_type: str = "np", return_dict: bool = True,
                 callback_on_step_end: Callable[..., dict[str, Any]] | None = None,
                 callback_on_step_end_tensor_inputs: list[str] | None = None):
        device = self._execution_device
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        batch = len(prompts)
        cfg = guidance_scale > 1.0
        embeds = self.encode_prompt(prompts, max_sequence_length, device)
        if cfg:
            negative = negative_prompt if negative_prompt is not None else ""
            negatives = [negative] * batch if isinstance(negative, str) else list(negative)
            embeds = torch.cat([self.encode_prompt(negatives, max_sequence_length, device), embeds])
        config, dtype = self.transformer.config, self.transformer.dtype
        shape = (batch, config.in_channels, num_frames, height // self.vae_scale_factor, width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        audio = randn_tensor((batch, config.audio_channels, audio_frames), generator=generator, device=device,
                             dtype=dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        sigmas = self.scheduler.sigmas
        tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        for i, t in enumerate(self.scheduler.timesteps):
            video_in, audio_in = (torch.cat([latents] * 2), torch.cat([audio] * 2)) if cfg else (latents, audio)
            velocity, audio_velocity = self.transformer(hidden_states=video_in, audio_hidden_states=audio_in,
                                                        encoder_hidden_states=embeds,
                                                        timestep=t.expand(video_in.shape[0]))
            if cfg:
                uncond, cond = velocity.chunk(2)
                velocity = uncond + guidance_scale * (cond - uncond)
                uncond, cond = audio_velocity.chunk(2)
                audio_velocity = uncond + guidance_scale * (cond - uncond)
            audio = audio + (sigmas[i + 1] - sigmas[i]) * audio_velocity  # the scheduler's Euler step
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                values = callback_on_step_end(self, i, t, {name: {"latents": latents}[name] for name in tensor_inputs})
                latents = values.get("latents", latents)

        flat = latents.transpose(1, 2).flatten(0, 1)  # one image per frame
        images = self.vae.decode(flat.to(self.vae.dtype) / self.vae.config.scaling_factor, return_dict=False)[0]
        images = self.image_processor.postprocess(images, output_type="np")
        frames = np.asarray(images).reshape(batch, num_frames, *images.shape[1:])
        waveform = self.vocoder(audio.to(self.vocoder.dtype)).float().cpu().numpy()
        self.maybe_free_model_hooks()
        if not return_dict:
            return (frames, waveform)
        return TinyAVPipelineOutput(frames=frames, audio=waveform)
