"""FLUX.1 pipelines (diffusers' FluxPipeline, subclassed) that hold and step their schedulers their own way, as real
pipelines do; loaded with `--pipeline scheduler_pipelines:NAME` on the zoo:flux folder. ditgate's capture of the
steps (ditgate.core.steps) must leave each of them doing exactly what it does without ditgate.

Each has one short denoising loop of its own (FLUX.1's arithmetic: the same prompt encoding, packed latents,
shifted sigmas, guidance embedding and decode) and differs only in how a step advances the latents:

- `SchedulerPerStream`: the image tokens as two streams, the second stepped by a deep copy of the scheduler made
  after its timesteps were set (one scheduler per stream, as audio-video pipelines keep one for each modality);
- `ShallowCopyPerStream`: the same with `copy.copy`;
- `SeveralSchedulers`: the second stream stepped by a second scheduler built from the first one's config;
- `StepsItself`: no scheduler step at all: the Euler update written in the loop from the scheduler's sigmas.

Every variant computes the same Euler update on every token, so all four give the same image.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from diffusers.pipelines.flux.pipeline_output import FluxPipelineOutput


class _OwnLoop(FluxPipeline):
    def __call__(self, prompt, height: int = 128, width: int = 128, num_inference_steps: int = 8,
                 guidance_scale: float = 3.5, generator=None, max_sequence_length: int = 32, output_type: str = "pil",
                 callback_on_step_end=None, callback_on_step_end_tensor_inputs=None):
        device = self._execution_device
        embeds, pooled, text_ids = self.encode_prompt(prompt=prompt, prompt_2=None, device=device,
                                                      max_sequence_length=max_sequence_length)
        latents, image_ids = self.prepare_latents(1, self.transformer.config.in_channels // 4, height, width,
                                                  embeds.dtype, device, generator)
        self.sigma_schedule = dict(sigmas=np.linspace(1.0, 1 / num_inference_steps, num_inference_steps), mu=calculate_shift(
            latents.shape[1], self.scheduler.config.get("base_image_seq_len", 256),
            self.scheduler.config.get("max_image_seq_len", 4096), self.scheduler.config.get("base_shift", 0.5),
            self.scheduler.config.get("max_shift", 1.15)))
        timesteps, _ = retrieve_timesteps(self.scheduler, num_inference_steps, device, **self.sigma_schedule)
        self.scheduler.set_begin_index(0)
        self.make_streams()
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full([1], guidance_scale, device=device, dtype=torch.float32)
        for i, t in enumerate(timesteps):
            velocity = self.transformer(hidden_states=latents, timestep=t.expand(1).to(latents.dtype) / 1000,
                                        guidance=guidance, pooled_projections=pooled, encoder_hidden_states=embeds,
                                        txt_ids=text_ids, img_ids=image_ids, return_dict=False)[0]
            latents = self.advance(i, t, velocity, latents)
            if callback_on_step_end is not None:
                latents = callback_on_step_end(self, i, t, {"latents": latents}).get("latents", latents)
        if output_type == "latent":
            return FluxPipelineOutput(images=latents)
        latents = self._unpack_latents(latents, height, width, self.vae_scale_factor)
        latents = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(latents, return_dict=False)[0]
        return FluxPipelineOutput(images=self.image_processor.postprocess(image, output_type=output_type))

    def make_streams(self) -> None:
        self.second = None

    def advance(self, i, t, velocity, latents):
        half = latents.shape[1] // 2
        first = self.scheduler.step(velocity[:, :half], t, latents[:, :half], return_dict=False)[0]
        second = self.second.step(velocity[:, half:], t, latents[:, half:], return_dict=False)[0]
        return torch.cat([first, second], dim=1)


class SchedulerPerStream(_OwnLoop):
    def make_streams(self) -> None:
        self.second = copy.deepcopy(self.scheduler)


class ShallowCopyPerStream(_OwnLoop):
    def make_streams(self) -> None:
        self.second = copy.copy(self.scheduler)


class SeveralSchedulers(_OwnLoop):
    def make_streams(self) -> None:
        self.second = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler.config)
        self.second.set_timesteps(len(self.scheduler.timesteps), device=self._execution_device,
                                  **self.sigma_schedule)
        self.second.set_begin_index(0)


class StepsItself(_OwnLoop):
    def advance(self, i, t, velocity, latents):
        sigmas = self.scheduler.sigmas
        return (latents.float() + (sigmas[i + 1] - sigmas[i]) * velocity.float()).to(latents.dtype)
