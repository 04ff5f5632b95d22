"""TinyMM: a small joint text-image diffusion transformer that is not part of diffusers.

It has what makes a model hard to parallelise, at a size that runs on a CPU in a second:

- joint attention over one sequence `[text tokens, image tokens]` (one block list, two streams);
- 2-D rotary position embedding for image tokens (row and column axes), 1-D positions for text tokens, computed
  by a module (`rope`) on the whole grid;
- a text padding mask that must reach attention: a 2-D `[B, 1, S, S]` mask in which real tokens see real tokens,
  and a padding token sees only the first token;
- grouped-query attention: fewer key/value heads than query heads.

It keeps the contract cache-dit relies on: `ModelMixin` + `ConfigMixin`, a top-level block `ModuleList`, one block
call per loop iteration with `hidden_states` first, `_repeated_blocks`, and step-dependent work (the AdaLN
modulation from the timestep) inside each block. Like much code written outside diffusers, the second stream of a
block is called `context`, not `encoder_hidden_states`, and the default attention processor calls
`torch.nn.functional.scaled_dot_product_attention` directly.
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


# -- helpers ------------------------------------------------------------------------------------------------------
def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/p * W/p, C * p * p), tokens in row-major order of the patch grid."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, grid_h: int, grid_w: int, patch: int) -> torch.Tensor:
    b, _, d = tokens.shape
    c = d // (patch * patch)
    x = tokens.reshape(b, grid_h, grid_w, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, grid_h * patch, grid_w * patch)


def joint_attention_mask(text_mask: torch.Tensor | None, text_len: int, image_len: int, batch: int,
                         device: torch.device) -> torch.Tensor:
    """The `[B, 1, S, S]` boolean mask of the joint sequence `[text, image]` (True: may attend).

    Real tokens attend to every real token; a padding text token attends only to the first token, which keeps every
    row non-empty (a pattern several released text-conditioned models use).
    """
    if text_mask is None:
        text_mask = torch.ones(batch, text_len, dtype=torch.bool, device=device)
    valid = torch.cat([text_mask.to(device=device, dtype=torch.bool),
                       torch.ones(text_mask.shape[0], image_len, dtype=torch.bool, device=device)], dim=1)
    allowed = valid[:, :, None] & valid[:, None, :]
    allowed[:, :, 0] = True
    return allowed[:, None]


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of `x` [B, S, H, D] by the angles in `rope` [S, D/2, 2] (cos, sin)."""
    cos, sin = rope[None, :, None, :, 0], rope[None, :, None, :, 1]
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


class TinyMMRoPE(nn.Module):
    """Rotary angles for the joint sequence: text token i at (i, i), image token (r, c) at (r, c).

    Half of the rotated pairs follow the first coordinate, half the second. Returns `(text, image)` tables of
    shape [L, D/2, 2] and [N, D/2, 2], computed from the whole grid of this call.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        pairs = head_dim // 2
        self.axis_pairs = (pairs // 2, pairs - pairs // 2)
        self.theta = theta

    def _angles(self, positions: torch.Tensor, pairs: int) -> torch.Tensor:
        freqs = self.theta ** (-torch.arange(pairs, dtype=torch.float64, device=positions.device) / pairs)
        return positions.double()[:, None] * freqs[None, :]

    def _table(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        angles = torch.cat([self._angles(first, self.axis_pairs[0]), self._angles(second, self.axis_pairs[1])], -1)
        return torch.stack([angles.cos(), angles.sin()], dim=-1).float()

    def forward(self, text_len: int, grid_h: int, grid_w: int, device: torch.device | None = None):
        text_pos = torch.arange(text_len, device=device)
        rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
        cols = torch.arange(grid_w, device=device).repeat(grid_h)
        return self._table(text_pos, text_pos), self._table(rows, cols)


class TinyMMAdaNorm(nn.Module):
    """LayerNorm without affine parameters, modulated by the timestep embedding: `chunks` shift/scale/gate vectors."""

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, temb: torch.Tensor):
        mods = self.linear(F.silu(temb))[:, None].chunk(self.chunks, dim=-1)
        return self.norm(x) * (1 + mods[1]) + mods[0], mods[2:]


class TinyMMFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


# -- attention ----------------------------------------------------------------------------------------------------
class TinyMMAttnProcessor:
    """Single-device joint attention: SDPA with the 2-D mask and grouped-query attention in the kernel."""

    _attention_backend = None
    _cp_config = None

    def __call__(self, attn: "TinyMMAttention", hidden_states: torch.Tensor, context: torch.Tensor,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                 attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        query, key, value = attn.joint_qkv(hidden_states, context, rotary_emb)
        out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                             attn_mask=attention_mask, enable_gqa=True)
        return attn.joint_out(out.transpose(1, 2), context.shape[1])


class TinyMMAttention(nn.Module, AttentionModuleMixin):
    """Joint attention of an image stream and a text stream with `heads` query and `kv_heads` key/value heads.

    Projections are separate per stream (`to_q/to_k/to_v` image, `add_q_proj/add_k_proj/add_v_proj` text), with a
    per-head RMSNorm on queries and keys. The joint sequence is `[text, image]`. Heads are read from the tensors
    (`unflatten(-1, (-1, head_dim))`), never from `heads`, so a sharded projection needs no attribute change.
    """

    _default_processor_cls = TinyMMAttnProcessor
    _available_processors = [TinyMMAttnProcessor]

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        inner, kv_inner = heads * head_dim, kv_heads * head_dim
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, kv_inner), nn.Linear(dim, kv_inner)
        self.add_q_proj, self.add_k_proj = nn.Linear(dim, inner), nn.Linear(dim, kv_inner)
        self.add_v_proj = nn.Linear(dim, kv_inner)
        self.norm_q, self.norm_k = nn.RMSNorm(head_dim, eps=1e-6), nn.RMSNorm(head_dim, eps=1e-6)
        self.norm_added_q, self.norm_added_k = nn.RMSNorm(head_dim, eps=1e-6), nn.RMSNorm(head_dim, eps=1e-6)
        self.to_out, self.to_add_out = nn.Linear(inner, dim), nn.Linear(inner, dim)
        self.set_processor(TinyMMAttnProcessor())

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim))

    def joint_qkv(self, hidden_states: torch.Tensor, context: torch.Tensor,
                  rotary_emb: tuple[torch.Tensor, torch.Tensor] | None):
        """Query, key and value of the joint sequence `[text, image]`, [B, S, heads, D], RoPE applied."""
        q = self.norm_q(self._heads(self.to_q(hidden_states)))
        k = self.norm_k(self._heads(self.to_k(hidden_states)))
        v = self._heads(self.to_v(hidden_states))
        cq = self.norm_added_q(self._heads(self.add_q_proj(context)))
        ck = self.norm_added_k(self._heads(self.add_k_proj(context)))
        cv = self._heads(self.add_v_proj(context))
        if rotary_emb is not None:
            text_rope, image_rope = rotary_emb
            q, k = apply_rope(q, image_rope), apply_rope(k, image_rope)
            cq, ck = apply_rope(cq, text_rope), apply_rope(ck, text_rope)
        return torch.cat([cq, q], dim=1), torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)

    def joint_out(self, out: torch.Tensor, text_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split the attention output [B, S, heads, D] back into (image, text) and project each stream."""
        out = out.flatten(2)
        return self.to_out(out[:, text_len:]), self.to_add_out(out[:, :text_len])

    def forward(self, hidden_states, context, rotary_emb=None, attention_mask=None):
        return self.processor(self, hidden_states, context, rotary_emb=rotary_emb, attention_mask=attention_mask)


# -- block and model ----------------------------------------------------------------------------------------------
class TinyMMBlock(nn.Module):
    """One joint block: AdaLN-modulated attention and feed-forward for the image and the text stream."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, mlp_ratio: float):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = TinyMMAdaNorm(dim, 6)
        self.norm1_context = TinyMMAdaNorm(dim, 6)
        self.attn = TinyMMAttention(dim, heads, kv_heads, head_dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.norm2_context = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = TinyMMFeedForward(dim, hidden)
        self.ff_context = TinyMMFeedForward(dim, hidden)

    def forward(self, hidden_states: torch.Tensor, context: torch.Tensor, temb: torch.Tensor,
                rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, (gate_msa, shift_mlp, scale_mlp, gate_mlp) = self.norm1(hidden_states, temb)
        c, (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp) = self.norm1_context(context, temb)
        attn_x, attn_c = self.attn(x, c, rotary_emb=rotary_emb, attention_mask=attention_mask)
        hidden_states = hidden_states + gate_msa * attn_x
        context = context + c_gate_msa * attn_c
        x = self.norm2(hidden_states) * (1 + scale_mlp) + shift_mlp
        hidden_states = hidden_states + gate_mlp * self.ff(x)
        c = self.norm2_context(context) * (1 + c_scale_mlp) + c_shift_mlp
        context = context + c_gate_mlp * self.ff_context(c)
        return hidden_states, context


class TinyMMTransformer2DModel(ModelMixin, ConfigMixin):
    """The TinyMM denoiser: latents (B, C, H, W) plus text states -> velocity (B, C, H, W)."""

    _repeated_blocks = ["TinyMMBlock"]
    _no_split_modules = ["TinyMMBlock"]

    @register_to_config
    def __init__(self, in_channels: int = 4, patch_size: int = 2, num_layers: int = 4, num_attention_heads: int = 4,
                 num_key_value_heads: int = 2, attention_head_dim: int = 16, text_dim: int = 32,
                 mlp_ratio: float = 2.0, rope_theta: float = 10000.0, timestep_dim: int = 64):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.x_embedder = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.context_embedder = nn.Linear(text_dim, dim)
        self.time_in = nn.Linear(timestep_dim, dim)
        self.time_out = nn.Linear(dim, dim)
        self.rope = TinyMMRoPE(attention_head_dim, rope_theta)
        self.transformer_blocks = nn.ModuleList(
            TinyMMBlock(dim, num_attention_heads, num_key_value_heads, attention_head_dim, mlp_ratio)
            for _ in range(num_layers))
        self.norm_out = TinyMMAdaNorm(dim, 2)
        self.proj_out = nn.Linear(dim, in_channels * patch_size * patch_size)

    def time_embedding(self, timestep: torch.Tensor) -> torch.Tensor:
        half = self.config.timestep_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=timestep.device, dtype=torch.float32) / half)
        args = timestep.float()[:, None] * freqs[None]
        emb = torch.cat([args.cos(), args.sin()], dim=-1).to(self.time_in.weight.dtype)
        return self.time_out(F.silu(self.time_in(emb)))

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None = None, return_dict: bool = True):
        batch, _, height, width = hidden_states.shape
        patch = self.config.patch_size
        grid_h, grid_w = height // patch, width // patch
        image = self.x_embedder(patchify(hidden_states, patch))
        text = self.context_embedder(encoder_hidden_states)
        temb = self.time_embedding(timestep)
        rotary_emb = self.rope(text.shape[1], grid_h, grid_w, device=image.device)
        attention_mask = joint_attention_mask(encoder_attention_mask, text.shape[1], image.shape[1], batch,
                                              image.device)
        for block in self.transformer_blocks:
            image, text = block(image, text, temb, rotary_emb=rotary_emb, attention_mask=attention_mask)
        image, _ = self.norm_out(image, temb)
        output = unpatchify(self.proj_out(image), grid_h, grid_w, patch)
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)
