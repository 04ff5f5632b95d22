"""Recipe: reorder an attention mask for Ulysses context parallelism, as a forward pre-hook built from the mesh size.

    python examples/recipes/mask_reorder.py                 # with the pre-hook: matches one process, exit 0
    python examples/recipes/mask_reorder.py --without-hook  # the mask left in its original order: exit 1

Under Ulysses each rank holds its chunk of the text and of the image tokens; the processor concatenates them
(`[text_r, image_r]` here) and the all-to-all hands attention the whole sequence in rank order
`[text_0, image_0, text_1, image_1, ...]`. A mask built for `[text, image]` must be permuted into that order: on the
key axis for a key mask `[B, 1, 1, S]`, on both axes for a full mask `[B, 1, S, S]`. Never split it.

cache-dit's split hooks wrap the module's `forward`; a torch forward pre-hook runs before that wrapper, so it sees
the unsplit inputs and can compute every rank's chunk from the mesh size alone (cache-dit chunks evenly;
Ulysses-anything uses `tensor_split`, which gives the same sizes whenever the length divides). No communication is
needed. cache-dit's own planners do the same inside a patched forward: `bria_fibo.py` `_build_ulysses_mask_perm`
(2-D mask, both axes; it gathers the per-rank lengths with `all_gather_object`) and `hunyuan.py` (a 1-D key mask,
image first: chunk the image part and the text part, concatenate chunk by chunk).

The check here needs no process group: it computes attention in exactly the order the all-to-all produces
(`ulysses_order`) and compares every token's output with the unsplit attention.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def chunk_sizes(length: int, world: int) -> list[int]:
    """How cache-dit splits `length` tokens over `world` ranks (even chunks; tensor_split when uneven)."""
    return [len(part) for part in torch.arange(length).tensor_split(world)]


def ulysses_order(text_len: int, image_len: int, world: int, text_first: bool = True) -> torch.Tensor:
    """perm[p] = the position in the unsplit sequence of the token the all-to-all puts at position p."""
    first, second = (text_len, image_len) if text_first else (image_len, text_len)
    firsts, seconds = torch.arange(first).tensor_split(world), (first + torch.arange(second)).tensor_split(world)
    return torch.cat([part for pair in zip(firsts, seconds) for part in pair])


def reorder_mask(mask: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Permute a key mask `[..., 1, S]` on its key axis, a full mask `[..., S, S]` on both axes."""
    mask = mask.index_select(-1, perm.to(mask.device))
    return mask.index_select(-2, perm.to(mask.device)) if mask.shape[-2] > 1 else mask


def chunk_cat_key_mask(mask: torch.Tensor, split: int, world: int) -> torch.Tensor:
    """The 1-D variant (cache-dit's hunyuan.py): a key mask whose first `split` positions are one stream, cut
    each stream into `world` chunks and concatenate them chunk by chunk."""
    firsts, seconds = mask[..., :split].chunk(world, dim=-1), mask[..., split:].chunk(world, dim=-1)
    return torch.cat([part for pair in zip(firsts, seconds) for part in pair], dim=-1)


def mask_reorder_pre_hook(world: int, text_key: str = "encoder_hidden_states", image_key: str = "hidden_states",
                          mask_key: str = "attention_mask"):
    """A `register_forward_pre_hook(..., with_kwargs=True)` hook that swaps the mask for its reordered copy.
    `world` is the Ulysses mesh size (`mesh.size()`); with 1 rank the hook changes nothing."""

    def hook(module, args, kwargs):
        mask = kwargs.get(mask_key)
        if world == 1 or mask is None:
            return args, kwargs
        perm = ulysses_order(kwargs[text_key].shape[1], kwargs[image_key].shape[1], world)
        return args, {**kwargs, mask_key: reorder_mask(mask, perm)}

    return hook


class UlyssesOrderAttention(nn.Module):
    """Joint attention computed the way Ulysses does it: the sequence in rank order, the mask used as given."""

    def __init__(self, world: int, heads: int = 2):
        super().__init__()
        self.world, self.heads = world, heads

    def forward(self, hidden_states, encoder_hidden_states, attention_mask=None):
        text_len, image_len = encoder_hidden_states.shape[1], hidden_states.shape[1]
        joint = torch.cat([encoder_hidden_states, hidden_states], dim=1)          # [text, image]
        perm = ulysses_order(text_len, image_len, self.world)
        gathered = joint[:, perm].unflatten(-1, (self.heads, -1)).transpose(1, 2)
        out = F.scaled_dot_product_attention(gathered, gathered, gathered, attn_mask=attention_mask)
        out = out.transpose(1, 2).flatten(2)
        restored = torch.empty_like(out)
        restored[:, perm] = out                                                     # back to [text, image]
        return restored


def padded_text_mask(text_len: int, real: int, image_len: int, full: bool) -> torch.Tensor:
    """Real text and image tokens see each other; padding text is hidden as a key (and, full, sees only itself)."""
    keys = torch.ones(text_len + image_len, dtype=torch.bool)
    keys[real:text_len] = False
    if not full:
        return keys.view(1, 1, 1, -1)
    mask = keys.expand(text_len + image_len, -1).clone()
    mask[real:text_len] = False
    mask[torch.arange(real, text_len), torch.arange(real, text_len)] = True
    return mask.view(1, 1, *mask.shape)


def check(with_hook: bool = True, world: int = 2, full: bool = True) -> float:
    """Max-abs difference between Ulysses-order attention and the unsplit attention, per token."""
    torch.manual_seed(0)
    text_len, real, image_len = 12, 5, 16
    image, text = torch.randn(1, image_len, 8), torch.randn(1, text_len, 8)
    mask = padded_text_mask(text_len, real, image_len, full)
    reference = UlyssesOrderAttention(world=1)(image, text, attention_mask=mask)
    module = UlyssesOrderAttention(world)
    if with_hook:
        module.register_forward_pre_hook(mask_reorder_pre_hook(world), with_kwargs=True)
    out = module(hidden_states=image, encoder_hidden_states=text, attention_mask=mask)
    return (out - reference).abs().max().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without-hook", action="store_true", help="leave the mask in its original order")
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    worst = 0.0
    for full in (True, False):
        err = check(not args.without_hook, args.world, full)
        worst = max(worst, err)
        print(f"{'full [B,1,S,S]' if full else 'key  [B,1,1,S]'} mask, Ulysses-{args.world}: max-abs {err:.2e}")
    ok = worst <= 1e-5
    print("matches one process" if ok else "WRONG: the mask does not follow the all-to-all order")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
