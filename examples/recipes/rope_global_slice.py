"""Recipe: RoPE positions under context parallelism when `forward` reads the frame count from the local shape.

    python examples/recipes/rope_global_slice.py             # with the patch, 2 ranks on gloo: exit 0
    python examples/recipes/rope_global_slice.py --without-patch   # positions restart on rank 1: exit 1

A root-level CP plan splits `hidden_states` before `transformer.forward` runs. A forward that then computes
`num_frames = hidden_states.shape[1] // tokens_per_frame` and builds its rotary table from it gets the LOCAL count:
every rank numbers its frames from 0, and after the all-to-all the tokens of rank 1 carry rank 0's positions (a
flicker or seam at the chunk boundary, no error). The fix patches the rotary module only: gather every rank's local
frame count, build the table on the global grid, keep this rank's rows by offset and length. Slice, never `chunk`:
under Ulysses-anything the split is uneven (9 frames on 2 ranks: 5 and 4). cache-dit's AnyFlow planner does this
(`cache_dit/distributed/transformers/anyflow.py`, `_patch_anyflow_rope_for_cp`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

FRAMES, TOKENS_PER_FRAME, DIM = 9, 4, 8


class FrameRope(nn.Module):
    """cos/sin tables for (frame, token-in-frame) positions, one row per token."""

    def forward(self, num_frames: int, tokens_per_frame: int) -> tuple[torch.Tensor, torch.Tensor]:
        frame = torch.arange(num_frames).repeat_interleave(tokens_per_frame)
        token = torch.arange(tokens_per_frame).repeat(num_frames)
        freqs = 1.0 / 100.0 ** (torch.arange(DIM // 4) / (DIM // 4))
        angles = torch.cat([frame[:, None] * freqs, token[:, None] * freqs], dim=-1)
        return angles.cos(), angles.sin()


class TinyVideoModel(nn.Module):
    """Reads the frame count from the shape of the (possibly split) hidden states, like many video DiTs."""

    def __init__(self):
        super().__init__()
        self.rope = FrameRope()

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_frames = hidden_states.shape[1] // TOKENS_PER_FRAME
        return self.rope(num_frames, TOKENS_PER_FRAME)


def patch_rope_for_cp(rope: nn.Module, group=None) -> None:
    """Compute the table on the global frame grid and return this rank's rows (offset + length)."""
    original = rope.forward

    def forward(num_frames: int, tokens_per_frame: int):
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        if world == 1:
            return original(num_frames, tokens_per_frame)
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([num_frames]), group=group)
        counts = [int(c) for c in counts]
        rank = dist.get_rank(group)
        start = sum(counts[:rank]) * tokens_per_frame
        length = counts[rank] * tokens_per_frame
        return tuple(t[start:start + length] for t in original(sum(counts), tokens_per_frame))

    rope.forward = forward


def _worker(rank: int, world: int, init: str, patches: tuple[bool, ...], results: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        hidden = torch.randn(1, FRAMES * TOKENS_PER_FRAME, DIM)
        frames = torch.arange(FRAMES).tensor_split(world)[rank]                      # uneven: 5 and 4 frames
        rows = slice(int(frames[0]) * TOKENS_PER_FRAME, (int(frames[-1]) + 1) * TOKENS_PER_FRAME)
        local = hidden[:, rows]
        found = {}
        for patch in patches:
            model = TinyVideoModel()
            expected = [t[rows] for t in model.rope(FRAMES, TOKENS_PER_FRAME)]      # the unsplit table's rows
            if patch:
                patch_rope_for_cp(model.rope)
            got = model(local)
            err = torch.tensor(max((g - e).abs().max().item() for g, e in zip(got, expected)))
            dist.all_reduce(err, op=dist.ReduceOp.MAX)
            found[patch] = float(err)
        if rank == 0:
            torch.save(found, results)
    finally:
        dist.destroy_process_group()


def run(patches: tuple[bool, ...] = (True,), world: int = 2) -> dict[bool, float]:
    """{patched: the largest difference, over ranks, between each rank's rotary rows and the unsplit table's}."""
    with tempfile.TemporaryDirectory() as tmp:
        init, results = f"file://{os.path.join(tmp, 'rendezvous')}", os.path.join(tmp, "err.pt")
        mp.spawn(_worker, args=(world, init, patches, results), nprocs=world, join=True)
        return torch.load(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without-patch", action="store_true", help="leave the rotary module as it is")
    args = parser.parse_args()
    patch = not args.without_patch
    err = run((patch,))[patch]
    ok = err <= 1e-6
    print(f"rotary rows on {FRAMES} frames split 5/4 over 2 ranks: max-abs {err:.2e} "
          + ("(global positions)" if ok else "(WRONG: positions restart on rank 1)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
