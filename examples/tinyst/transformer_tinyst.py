"""TinyST: a small video diffusion transformer with factorized spatio-temporal attention, not part of diffusers.

What makes it hard to integrate, at a size that runs on a CPU in a second:

- two interleaved block lists: `spatial_blocks[i]` attends within each frame, then `temporal_blocks[i]` attends
  across frames at each token position. Between the two the loop rearranges the hidden states: a spatial block sees
  `[batch * frames, tokens, dim]`, a temporal block `[batch * tokens, frames, dim]`. A split of the tokens of a frame
  therefore divides dimension 1 in the spatial list and dimension 0 in the temporal list;
- a 2-D sin-cos position table built in `forward` (no module makes it) and handed unchanged to every spatial block,
  and a frame table handed to every temporal block;
- cross-attention of every spatial block to the text, with the text padding mask on the keys; the pipeline runs a
  batched classifier-free-guidance pair whose negative prompt is shorter than the prompt, so the two halves of the
  batch are masked differently.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn


def patchify(frames: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/p * W/p, C * p * p), tokens in row-major order."""
    b, c, h, w = frames.shape
    x = frames.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, grid_h: int, grid_w: int, patch: int) -> torch.Tensor:
    b, _, d = tokens.shape
    c = d // (patch * patch)
    x = tokens.reshape(b, grid_h, grid_w, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, grid_h * patch, grid_w * patch)


def sincos(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[P] positions -> [P, dim] sin-cos features."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    args = positions.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=-1)


def to_temporal(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[B * F, N, D] -> [B * N, F, D]."""
    return x.unflatten(0, (batch, -1)).transpose(1, 2).flatten(0, 1)


def to_spatial(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[B * N, F, D] -> [B * F, N, D]."""
    return x.unflatten(0, (batch, -1)).transpose(1, 2).flatten(0, 1)


def expand_batch(value: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """Repeat each sample of `value` so that its batch matches `batch` (a multiple of it)."""
    if value is None or value.shape[0] == batch:
        return value
    return value.repeat_interleave(batch // value.shape[0], dim=0)


class TinySTAttnProcessor:
    """Single-device attention: SDPA directly (self-attention, or cross-attention with a key padding mask)."""

    _attention_backend = None
    _cp_config = None

    def __call__(self, attn: "TinySTAttention", hidden_states, context=None, key_mask=None):
        query, key, value = attn.qkv(hidden_states, context)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                             attn_mask=mask)
        return attn.to_out(out.transpose(1, 2).flatten(2))


class TinySTAttention(nn.Module, AttentionModuleMixin):
    """Multi-head attention; keys and values from `context` when given (cross-attention)."""

    _default_processor_cls = TinySTAttnProcessor
    _available_processors = [TinySTAttnProcessor]

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.to_out = nn.Linear(inner, dim)
        self.set_processor(TinySTAttnProcessor())

    def qkv(self, hidden_states, context=None):
        source = hidden_states if context is None else context
        split = lambda x: x.unflatten(-1, (-1, self.head_dim))  # noqa: E731
        return split(self.to_q(hidden_states)), split(self.to_k(source)), split(self.to_v(source))

    def forward(self, hidden_states, context=None, key_mask=None):
        return self.processor(self, hidden_states, context, key_mask)


class TinySTAdaNorm(nn.Module):
    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, temb):
        mods = self.linear(F.silu(temb))[:, None].chunk(self.chunks, dim=-1)
        return self.norm(x) * (1 + mods[1]) + mods[0], mods[2:]


class TinySTFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class TinySTSpatialBlock(nn.Module):
    """Attention within each frame (`hidden_states` [B * F, N, D]), cross-attention to the text, feed-forward."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = TinySTAdaNorm(dim, 4)
        self.attn = TinySTAttention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.cross = TinySTAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.ff = TinySTFeedForward(dim, 2 * dim)

    def forward(self, hidden_states, context, temb, pos, context_mask=None):
        batch = hidden_states.shape[0]
        temb, context, context_mask = (expand_batch(v, batch) for v in (temb, context, context_mask))
        x, (gate, gate_ff) = self.norm1(hidden_states, temb)
        hidden_states = hidden_states + gate * self.attn(x + pos)
        hidden_states = hidden_states + self.cross(self.norm2(hidden_states), context, context_mask)
        return hidden_states + gate_ff * self.ff(self.norm3(hidden_states))


class TinySTTemporalBlock(nn.Module):
    """Attention across frames at each token position (`hidden_states` [B * N, F, D]) and a feed-forward."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = TinySTAdaNorm(dim, 4)
        self.attn = TinySTAttention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ff = TinySTFeedForward(dim, 2 * dim)

    def forward(self, hidden_states, temb, frame_pos):
        temb = expand_batch(temb, hidden_states.shape[0])
        x, (gate, gate_ff) = self.norm1(hidden_states, temb)
        hidden_states = hidden_states + gate * self.attn(x + frame_pos)
        return hidden_states + gate_ff * self.ff(self.norm2(hidden_states))


class TinySTTransformer3DModel(ModelMixin, ConfigMixin):
    """Latents (B, C, F, H, W) plus text states -> velocity (B, C, F, H, W)."""

    _repeated_blocks = ["TinySTSpatialBlock", "TinySTTemporalBlock"]
    _no_split_modules = ["TinySTSpatialBlock", "TinySTTemporalBlock"]

    @register_to_config
    def __init__(self, in_channels: int = 4, patch_size: int = 2, num_layers: int = 2, num_attention_heads: int = 4,
                 attention_head_dim: int = 8, text_dim: int = 32, timestep_dim: int = 32):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.context_embedder = nn.Linear(text_dim, dim)
        self.time_in, self.time_out = nn.Linear(timestep_dim, dim), nn.Linear(dim, dim)
        self.spatial_blocks = nn.ModuleList(
            TinySTSpatialBlock(dim, num_attention_heads, attention_head_dim) for _ in range(num_layers))
        self.temporal_blocks = nn.ModuleList(
            TinySTTemporalBlock(dim, num_attention_heads, attention_head_dim) for _ in range(num_layers))
        self.norm_out = TinySTAdaNorm(dim, 2)
        self.proj_out = nn.Linear(dim, in_channels * patch_size * patch_size)

    def time_embedding(self, timestep):
        emb = sincos(timestep, self.config.timestep_dim).to(self.time_in.weight.dtype)
        return self.time_out(F.silu(self.time_in(emb)))

    def position_table(self, grid_h: int, grid_w: int, device) -> torch.Tensor:
        """[N, D]: half the features follow the row, half the column of each token of a frame."""
        dim = self.config.num_attention_heads * self.config.attention_head_dim
        rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
        cols = torch.arange(grid_w, device=device).repeat(grid_h)
        return torch.cat([sincos(rows, dim // 2), sincos(cols, dim // 2)], dim=-1)

    def forward(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask=None,
                return_dict: bool = True):
        batch, _, frames, height, width = hidden_states.shape
        patch = self.config.patch_size
        grid_h, grid_w = height // patch, width // patch
        flat = hidden_states.transpose(1, 2).flatten(0, 1)  # [B * F, C, H, W]
        x = self.x_embedder(patchify(flat, patch))  # [B * F, N, D]
        context = self.context_embedder(encoder_hidden_states)
        mask = encoder_attention_mask.bool() if encoder_attention_mask is not None else None
        temb = self.time_embedding(timestep)
        pos = self.position_table(grid_h, grid_w, x.device).to(x.dtype)
        frame_pos = sincos(torch.arange(frames, device=x.device), x.shape[-1]).to(x.dtype)
        for spatial, temporal in zip(self.spatial_blocks, self.temporal_blocks):
            x = spatial(x, context, temb, pos, mask)
            x = to_spatial(temporal(to_temporal(x, batch), temb, frame_pos), batch)
        x, _ = self.norm_out(x, expand_batch(temb, x.shape[0]))
        out = unpatchify(self.proj_out(x), grid_h, grid_w, patch)  # [B * F, C, H, W]
        out = out.unflatten(0, (batch, frames)).transpose(1, 2)
        if not return_dict:
            return (out,)
        return Transformer2DModelOutput(sample=out)
