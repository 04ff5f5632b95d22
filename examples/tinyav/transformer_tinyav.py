"""TinyAV: a small video-and-audio diffusion transformer with fused blocks, not part of diffusers.

What makes it hard to integrate, at a size that runs on a CPU in a second:

- every block takes two sequences and returns both: the video tokens (`hidden_states`, all frames' patches,
  [B, F * N, D]) and the audio tokens (`encoder_hidden_states`, one per audio latent frame, [B, L, D]; 31 by
  default, a count two ranks do not divide). The text goes to both streams by cross-attention (`context`);
- the audio attends to the video (audio queries, video keys: the sound follows the picture), the video never to
  the audio. Context parallelism can split the long video stream and keep the short audio stream whole on every
  rank, but then the audio's cross-attention needs the whole video: each rank holds only its share of it;
- two outputs: the video velocity and the audio velocity, decoded by a VAE and a vocoder into frames and a waveform.

The attention, ada-norm and feed-forward layers are TinyST's (examples/tinyst).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn
from tinyst.transformer_tinyst import TinySTAdaNorm, TinySTAttention, TinySTFeedForward, expand_batch, patchify, \
    sincos, unpatchify


class TinyAVBlock(nn.Module):
    """Video: self-attention, text cross-attention, feed-forward. Audio: self-attention, text and video
    cross-attention, feed-forward. Returns (video, audio)."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = TinySTAdaNorm(dim, 4)
        self.attn = TinySTAttention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.cross = TinySTAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.ff = TinySTFeedForward(dim, 2 * dim)
        self.audio_norm1 = TinySTAdaNorm(dim, 4)
        self.audio_attn = TinySTAttention(dim, heads, head_dim)
        self.audio_norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.audio_cross = TinySTAttention(dim, heads, head_dim)
        self.audio_norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.video_to_audio = TinySTAttention(dim, heads, head_dim)
        self.audio_norm4 = nn.LayerNorm(dim, eps=1e-6)
        self.audio_ff = TinySTFeedForward(dim, 2 * dim)

    def forward(self, hidden_states, encoder_hidden_states, context, temb):
        audio = encoder_hidden_states
        x, (gate, gate_ff) = self.norm1(hidden_states, temb)
        hidden_states = hidden_states + gate * self.attn(x)
        hidden_states = hidden_states + self.cross(self.norm2(hidden_states), context)
        hidden_states = hidden_states + gate_ff * self.ff(self.norm3(hidden_states))
        y, (audio_gate, audio_gate_ff) = self.audio_norm1(audio, temb)
        audio = audio + audio_gate * self.audio_attn(y)
        audio = audio + self.audio_cross(self.audio_norm2(audio), context)
        audio = audio + self.video_to_audio(self.audio_norm3(audio), hidden_states)
        audio = audio + audio_gate_ff * self.audio_ff(self.audio_norm4(audio))
        return hidden_states, audio


class TinyAVTransformer3DModel(ModelMixin, ConfigMixin):
    """Video latents (B, C, F, H, W), audio latents (B, A, L) and text states -> both velocities."""

    _repeated_blocks = ["TinyAVBlock"]
    _no_split_modules = ["TinyAVBlock"]

    @register_to_config
    def __init__(self, in_channels: int = 4, audio_channels: int = 8, patch_size: int = 2, num_layers: int = 2,
                 num_attention_heads: int = 4, attention_head_dim: int = 8, text_dim: int = 32,
                 timestep_dim: int = 32):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.audio_embedder = nn.Linear(audio_channels, dim)
        self.context_embedder = nn.Linear(text_dim, dim)
        self.time_in, self.time_out = nn.Linear(timestep_dim, dim), nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(TinyAVBlock(dim, num_attention_heads, attention_head_dim)
                                    for _ in range(num_layers))
        self.norm_out = TinySTAdaNorm(dim, 2)
        self.proj_out = nn.Linear(dim, in_channels * patch_size * patch_size)
        self.audio_norm_out = TinySTAdaNorm(dim, 2)
        self.audio_proj_out = nn.Linear(dim, audio_channels)

    def time_embedding(self, timestep):
        emb = sincos(timestep, self.config.timestep_dim).to(self.time_in.weight.dtype)
        return self.time_out(F.silu(self.time_in(emb)))

    def forward(self, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, return_dict: bool = True):
        batch, _, frames, height, width = hidden_states.shape
        patch = self.config.patch_size
        grid_h, grid_w = height // patch, width // patch
        flat = hidden_states.transpose(1, 2).flatten(0, 1)  # [B * F, C, H, W]
        x = self.x_embedder(patchify(flat, patch)).unflatten(0, (batch, frames)).flatten(1, 2)  # [B, F * N, D]
        x = x + sincos(torch.arange(x.shape[1], device=x.device), x.shape[-1]).to(x.dtype)
        audio = self.audio_embedder(audio_hidden_states.transpose(1, 2))  # [B, L, D]
        audio = audio + sincos(torch.arange(audio.shape[1], device=x.device), x.shape[-1]).to(x.dtype)
        context = self.context_embedder(encoder_hidden_states)
        temb = self.time_embedding(timestep)
        for block in self.blocks:
            x, audio = block(x, audio, context, temb)
        x, _ = self.norm_out(x, expand_batch(temb, x.shape[0]))
        x = self.proj_out(x).unflatten(1, (frames, -1)).flatten(0, 1)  # [B * F, N, C * p * p]
        video = unpatchify(x, grid_h, grid_w, patch).unflatten(0, (batch, frames)).transpose(1, 2)
        audio, _ = self.audio_norm_out(audio, temb)
        audio = self.audio_proj_out(audio).transpose(1, 2)  # [B, A, L]
        return (video, audio)
