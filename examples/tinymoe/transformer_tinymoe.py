"""TinyMoE: a small image diffusion transformer with an expert-choice mixture of experts, not part of diffusers.

What makes it hard to integrate, at a size that runs on a CPU in a second:

- expert-choice routing: every expert takes the `capacity` tokens that score highest for it, picked over the whole
  sequence (top-k over tokens, not over experts). A rank that sees only its slice of the sequence picks other
  tokens, so context parallelism must gather the sequence before the router and split it again after the experts;
- packed expert weights: `w_in` [experts, dim, hidden] and `w_out` [experts, hidden, dim] are 3-D parameters, not
  Linear layers, so `ColwiseParallel` / `RowwiseParallel` cannot take them;
- a fused SwiGLU (the shared expert): one Linear whose output is chunked in two, `silu(gate) * up`;
- chunked modulation: one Linear (`ada`) makes the six shift/scale/gate vectors of a block (`chunk(6)`);
- per-head RMS norms on queries and keys called `q_norm` / `k_norm`, and a rotary module (`rope`) called twice in
  each forward (row angles, then column angles);
- a long skip: the embedded input is added to the output of the last block.
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


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, grid_h: int, grid_w: int, patch: int) -> torch.Tensor:
    b, _, d = tokens.shape
    c = d // (patch * patch)
    x = tokens.reshape(b, grid_h, grid_w, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, grid_h * patch, grid_w * patch)


class TinyMoERoPE(nn.Module):
    """Rotary angles of 1-D positions: [P] -> [P, pairs, 2] (cos, sin)."""

    def __init__(self, pairs: int, theta: float = 10000.0):
        super().__init__()
        self.pairs, self.theta = pairs, theta

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        freqs = self.theta ** (-torch.arange(self.pairs, dtype=torch.float64, device=positions.device) / self.pairs)
        angles = positions.double()[:, None] * freqs[None]
        return torch.stack([angles.cos(), angles.sin()], dim=-1).float()


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    cos, sin = rope[None, :, None, :, 0], rope[None, :, None, :, 1]
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).to(x.dtype)


class TinyMoEAttnProcessor:
    _attention_backend = None
    _cp_config = None

    def __call__(self, attn: "TinyMoEAttention", hidden_states, rope=None):
        query, key, value = attn.qkv(hidden_states, rope)
        out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        return attn.to_out(out.transpose(1, 2).flatten(2))


class TinyMoEAttention(nn.Module, AttentionModuleMixin):
    _default_processor_cls = TinyMoEAttnProcessor
    _available_processors = [TinyMoEAttnProcessor]

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.q_norm, self.k_norm = nn.RMSNorm(head_dim, eps=1e-6), nn.RMSNorm(head_dim, eps=1e-6)
        self.to_out = nn.Linear(inner, dim)
        self.set_processor(TinyMoEAttnProcessor())

    def qkv(self, hidden_states, rope=None):
        split = lambda x: x.unflatten(-1, (-1, self.head_dim))  # noqa: E731
        q, k = self.q_norm(split(self.to_q(hidden_states))), self.k_norm(split(self.to_k(hidden_states)))
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        return q, k, split(self.to_v(hidden_states))

    def forward(self, hidden_states, rope=None):
        return self.processor(self, hidden_states, rope)


class TinyMoESwiGLU(nn.Module):
    """The shared expert: one Linear makes gate and up (`chunk(2)`), `silu(gate) * up` goes down."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj_in, self.proj_out = nn.Linear(dim, 2 * hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        gate, up = self.proj_in(x).chunk(2, dim=-1)
        return self.proj_out(F.silu(gate) * up)


class TinyMoEExpertChoice(nn.Module):
    """Expert-choice MoE: each expert takes its `capacity` best tokens of the sequence; plus a shared SwiGLU."""

    def __init__(self, dim: int, hidden: int, experts: int, capacity_factor: float = 1.0):
        super().__init__()
        self.experts, self.capacity_factor = experts, capacity_factor
        self.router = nn.Linear(dim, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w_out = nn.Parameter(torch.randn(experts, hidden, dim) / math.sqrt(hidden))
        self.shared = TinyMoESwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        capacity = max(1, int(s * self.capacity_factor / self.experts))
        scores = self.router(x).softmax(dim=-1).transpose(1, 2)  # [B, E, S]
        weight, index = scores.topk(capacity, dim=-1)  # over tokens: the whole sequence decides
        flat = index.flatten(1)[..., None].expand(-1, -1, d)
        tokens = x.gather(1, flat).unflatten(1, (self.experts, capacity))  # [B, E, C, D]
        hidden = F.gelu(torch.einsum("becd,edh->bech", tokens, self.w_in), approximate="tanh")
        y = torch.einsum("bech,ehd->becd", hidden, self.w_out) * weight[..., None]
        routed = torch.zeros_like(x).scatter_add(1, flat, y.flatten(1, 2))
        return routed + self.shared(x)


class TinyMoEBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, experts: int):
        super().__init__()
        self.ada = nn.Linear(dim, 6 * dim)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = TinyMoEAttention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.moe = TinyMoEExpertChoice(dim, hidden, experts)

    def forward(self, hidden_states, temb, rope=None):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(temb))[:, None].chunk(6, dim=-1)
        x = self.norm1(hidden_states) * (1 + scale1) + shift1
        hidden_states = hidden_states + gate1 * self.attn(x, rope)
        x = self.norm2(hidden_states) * (1 + scale2) + shift2
        return hidden_states + gate2 * self.moe(x)


class TinyMoETransformer2DModel(ModelMixin, ConfigMixin):
    """Latents (B, C, H, W), pooled text and the timestep -> velocity (B, C, H, W)."""

    _repeated_blocks = ["TinyMoEBlock"]
    _no_split_modules = ["TinyMoEBlock"]

    @register_to_config
    def __init__(self, in_channels: int = 4, patch_size: int = 2, num_layers: int = 2, num_attention_heads: int = 4,
                 attention_head_dim: int = 8, text_dim: int = 32, timestep_dim: int = 32, num_experts: int = 4,
                 expert_dim: int = 64):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.text_proj = nn.Linear(text_dim, dim)
        self.time_in, self.time_out = nn.Linear(timestep_dim, dim), nn.Linear(dim, dim)
        self.rope = TinyMoERoPE(attention_head_dim // 4)
        self.blocks = nn.ModuleList(
            TinyMoEBlock(dim, num_attention_heads, attention_head_dim, expert_dim, num_experts)
            for _ in range(num_layers))
        self.norm_out = nn.LayerNorm(dim, eps=1e-6)
        self.proj_out = nn.Linear(dim, in_channels * patch_size * patch_size)

    def conditioning(self, timestep, text, mask):
        half = self.config.timestep_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=timestep.device, dtype=torch.float32) / half)
        args = timestep.float()[:, None] * freqs[None]
        temb = self.time_out(F.silu(self.time_in(torch.cat([args.cos(), args.sin()], -1).to(text.dtype))))
        weights = mask.to(text.dtype)[..., None] if mask is not None else torch.ones_like(text[..., :1])
        pooled = (text * weights).sum(1) / weights.sum(1).clamp(min=1)
        return temb + self.text_proj(pooled)

    def forward(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask=None,
                return_dict: bool = True):
        _, _, height, width = hidden_states.shape
        patch = self.config.patch_size
        grid_h, grid_w = height // patch, width // patch
        x = self.x_embedder(patchify(hidden_states, patch))
        temb = self.conditioning(timestep, encoder_hidden_states, encoder_attention_mask)
        rows = torch.arange(grid_h, device=x.device).repeat_interleave(grid_w)
        cols = torch.arange(grid_w, device=x.device).repeat(grid_h)
        rope = torch.cat([self.rope(rows), self.rope(cols)], dim=1)  # [N, head_dim / 2, 2]
        skip = x
        for block in self.blocks:
            x = block(x, temb, rope)
        x = x + skip  # a long skip: the embedded input joins the output of the last block
        out = unpatchify(self.proj_out(self.norm_out(x)), grid_h, grid_w, patch)
        if not return_dict:
            return (out,)
        return Transformer2DModelOutput(sample=out)
