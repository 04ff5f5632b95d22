"""Pipelines that take, step and return things their own way, as real pipelines do: each is TinyMM's pipeline
(examples/tinymm) behind another `__call__`, loaded with `--pipeline contract_pipelines:NAME` on the zoo:tinymm
folder. The runtime contract (ditgate.core.request, ditgate.core.steps, ditgate.run.exec.outputs) must run every
default row of each without an adapter."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tinymm import TinyMMPipeline


@dataclass
class ClipOutput:
    frames: torch.Tensor


class NoCallbackPipeline(TinyMMPipeline):
    """No step callback of any kind: the final latents can only be found at the scheduler."""

    def __call__(self, prompt, negative_prompt=None, height: int = 64, width: int = 64, num_inference_steps: int = 8,
                 guidance_scale: float = 4.0, generator=None, max_sequence_length: int = 64,
                 output_type: str = "pil", return_dict: bool = True):
        return super().__call__(prompt, negative_prompt, height, width, num_inference_steps, guidance_scale,
                                generator, None, max_sequence_length, output_type, return_dict)


class ArrayPipeline(TinyMMPipeline):
    """Returns a bare NumPy array [B, H, W, C]; no callback, no output_type, and 6 steps by its own default."""

    def __call__(self, prompt, height: int = 64, width: int = 64, num_inference_steps: int = 6,
                 guidance_scale: float = 4.0, generator=None, max_sequence_length: int = 64):
        return super().__call__(prompt, None, height, width, num_inference_steps, guidance_scale, generator, None,
                                max_sequence_length, "np", True).images


class TuplePipeline(TinyMMPipeline):
    """Returns a one-element tuple holding a list of PIL images, whatever it is asked."""

    def __call__(self, prompt, negative_prompt=None, height: int = 64, width: int = 64, num_inference_steps: int = 8,
                 guidance_scale: float = 4.0, generator=None, max_sequence_length: int = 64):
        return (super().__call__(prompt, negative_prompt, height, width, num_inference_steps, guidance_scale,
                                 generator, None, max_sequence_length, "pil", True).images,)


class ClipPipeline(TinyMMPipeline):
    """A clip of `video_length` frames (its frame argument is not `num_frames`), each frame drawn from its own
    noise in one batched call; returns `frames` as a tensor [B, F, C, H, W] in [0, 1]."""

    def __call__(self, prompt, video_length: int = 2, height: int = 64, width: int = 64,
                 num_inference_steps: int = 8, guidance_scale: float = 4.0, generator=None,
                 max_sequence_length: int = 64):
        images = super().__call__([prompt] * video_length, None, height, width, num_inference_steps, guidance_scale,
                                  generator, None, max_sequence_length, "pt", True).images
        return ClipOutput(frames=images[None].clamp(0, 1))


class SelfSteppingPipeline(TinyMMPipeline):
    """Does its own Euler update (no scheduler step, no callback) and returns only the decoded image: nothing can
    see its final latents, so an exact row's tensor rule cannot run."""

    def __call__(self, prompt, height: int = 64, width: int = 64, num_inference_steps: int = 8,
                 guidance_scale: float = 4.0, generator=None, max_sequence_length: int = 64):
        device = self._execution_device
        embeds, mask = self.encode_prompt([prompt], max_sequence_length, device)
        shape = (1, self.transformer.config.in_channels, height // self.vae_scale_factor,
                 width // self.vae_scale_factor)
        latents = torch.randn(shape, generator=generator).to(device, self.transformer.dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        sigmas = self.scheduler.sigmas
        for i, t in enumerate(self.scheduler.timesteps):
            velocity = self.transformer(hidden_states=latents, encoder_hidden_states=embeds,
                                        timestep=t.expand(1), encoder_attention_mask=mask, return_dict=False)[0]
            latents = latents + (sigmas[i + 1] - sigmas[i]) * velocity
        scaled = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(scaled.to(self.vae.dtype), return_dict=False)[0]
        return self.image_processor.postprocess(image, output_type="np")
