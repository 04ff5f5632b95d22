"""Recipe: tensor parallelism of a fused single-stream block (one Linear for Q, K, V and the MLP input; one Linear
for the attention output and the MLP output), as in Flux.2's single blocks.

    python examples/recipes/fused_qkv_tp.py                  # relayout and replicate, 2 ranks on gloo: exit 0
    python examples/recipes/fused_qkv_tp.py --layout plain   # the relayout left out: exit 1

Layouts (each rank's output is compared with one process running the same seeded block):
- "relayout": reorder the fused weights so that rank r's slice holds its own heads of Q, K, V and its own part of the
  MLP, then shard them like separate layers (Colwise in, Rowwise out) and divide the block's size attributes by the
  TP size. This is what cache-dit's Flux.2 planner does (`Flux2TensorParallelismPlanner.rearrange_singleblock_weight`).
- "replicate": shard the fused input Linear with `ColwiseParallel(output_layouts=Replicate())` and the output Linear
  with `RowwiseParallel(input_layouts=Replicate())`: every rank sees the full fused tensor, no relayout and no
  attribute change. Correct, but it saves no attention work (only weight memory).
- "plain": Colwise/Rowwise on the fused weights as they are (the relayout left out). Rank 0's slice holds all of Q and
  part of K, rank 1's the rest of K, V and the MLP: the numbers are wrong even where the shapes happen to fit.
- "plain-sizes": the same without dividing the size attributes: the crash signature of a plain shard,
  `RuntimeError: split_with_sizes expects split_sizes to sum exactly to 96 (input tensor's size at dimension -1)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

DIM, HEADS, HEAD_DIM, MLP = 32, 4, 8, 48
LAYOUTS = ("relayout", "replicate", "plain", "plain-sizes")
CORRECT = ("relayout", "replicate")
TOLERANCE = 1e-5


class FusedSingleBlock(nn.Module):
    """Joint attention and a SwiGLU MLP whose projections are fused, reading its sizes from attributes."""

    def __init__(self):
        super().__init__()
        self.heads, self.inner_dim, self.mlp_hidden = HEADS, HEADS * HEAD_DIM, MLP
        self.to_qkv_mlp = nn.Linear(DIM, 3 * self.inner_dim + 2 * MLP)     # [Q; K; V; gate; up]
        self.to_out = nn.Linear(self.inner_dim + MLP, DIM)                  # input [attention; MLP]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.to_qkv_mlp(x)
        qkv, mlp = fused.split([3 * self.inner_dim, 2 * self.mlp_hidden], dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        gate, up = mlp.chunk(2, dim=-1)
        return x + self.to_out(torch.cat([attn, F.silu(gate) * up], dim=-1))


def _groups(rows: torch.Tensor, parts: int, tp: int) -> torch.Tensor:
    """[parts * tp * n, C] laid out part-major -> rank-major: (part, rank, n) -> (rank, part, n)."""
    return rows.unflatten(0, (parts, tp, -1)).transpose(0, 1).flatten(0, 2)


def relayout(block: FusedSingleBlock, tp: int) -> None:
    """Reorder the fused weights so that a plain row/column split gives each rank its own heads and MLP slice."""
    inner, mlp = block.inner_dim, block.mlp_hidden
    with torch.no_grad():
        w, b = block.to_qkv_mlp.weight, block.to_qkv_mlp.bias                     # rows: [Q; K; V; gate; up]
        qkv_w, mlp_w = w.split([3 * inner, 2 * mlp])
        qkv_b, mlp_b = b.split([3 * inner, 2 * mlp])
        # per rank: [Q_r; K_r; V_r] then [gate_r; up_r]; rank slices are contiguous after the outer interleave
        qkv_w, qkv_b = _groups(qkv_w, 3, tp).unflatten(0, (tp, -1)), _groups(qkv_b, 3, tp).unflatten(0, (tp, -1))
        mlp_w, mlp_b = _groups(mlp_w, 2, tp).unflatten(0, (tp, -1)), _groups(mlp_b, 2, tp).unflatten(0, (tp, -1))
        w.copy_(torch.cat([qkv_w, mlp_w], dim=1).flatten(0, 1))
        b.copy_(torch.cat([qkv_b, mlp_b], dim=1).flatten(0, 1))
        out = block.to_out.weight                                                 # columns: [attention; MLP]
        attn_cols, mlp_cols = out.split([inner, mlp], dim=1)
        attn_cols, mlp_cols = attn_cols.unflatten(1, (tp, -1)), mlp_cols.unflatten(1, (tp, -1))
        out.copy_(torch.cat([attn_cols, mlp_cols], dim=2).flatten(1))
    # every size the forward reads is now the local one (in a cache-dit planner:
    # `cache_dit.distributed.utils.shard_div_attr(block.attn, "heads", tp)`, which also checks divisibility)
    for attr in ("heads", "inner_dim", "mlp_hidden"):
        setattr(block, attr, getattr(block, attr) // tp)


def parallelize(block: FusedSingleBlock, mesh, layout: str) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    if layout == "replicate":
        plan = {"to_qkv_mlp": ColwiseParallel(output_layouts=Replicate()),
                "to_out": RowwiseParallel(input_layouts=Replicate())}
    else:
        if layout == "relayout":
            relayout(block, tp)
        elif layout == "plain":      # the sizes are divided, the weights are not reordered
            for attr in ("heads", "inner_dim", "mlp_hidden"):
                setattr(block, attr, getattr(block, attr) // tp)
        # "plain-sizes": neither: the forward still splits by the full sizes
        plan = {"to_qkv_mlp": ColwiseParallel(), "to_out": RowwiseParallel()}
    parallelize_module(block, mesh, plan)


def reference() -> tuple[dict, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    block = FusedSingleBlock()
    x = torch.randn(2, 10, DIM)
    with torch.no_grad():
        return block.state_dict(), x, block(x)


def _worker(rank: int, world: int, init: str, layouts: tuple[str, ...], results: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        state, x, expected = reference()
        found = {}
        for layout in layouts:
            block = FusedSingleBlock()
            block.load_state_dict(state)
            try:
                parallelize(block, mesh, layout)
                with torch.no_grad():
                    err = (block(x) - expected).abs().max().item()
                outcome = f"max-abs {err:.2e}"
                ok = err <= TOLERANCE
            except Exception as exc:  # noqa: BLE001 - a crash is one of the outcomes this recipe shows
                outcome, ok = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}", False
            found[layout] = (ok, outcome)
        if rank == 0:
            torch.save(found, results)
    finally:
        dist.destroy_process_group()


def run(layouts: tuple[str, ...] = LAYOUTS, world: int = 2) -> dict[str, tuple[bool, str]]:
    """{layout: (matches one process, what happened)} for a TP group of `world` ranks on gloo."""
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        results = os.path.join(tmp, "results.pt")
        mp.spawn(_worker, args=(world, init, layouts, results), nprocs=world, join=True)
        return torch.load(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=LAYOUTS, action="append",
                        help=f"layouts to try (default: {', '.join(CORRECT)}); exit 0 when all match one process")
    args = parser.parse_args()
    layouts = tuple(args.layout or CORRECT)
    results = run(layouts)
    for layout in layouts:
        ok, outcome = results[layout]
        print(f"{layout:9s} {'matches one process' if ok else 'WRONG'}: {outcome}")
    return 0 if all(results[layout][0] for layout in layouts) else 1


if __name__ == "__main__":
    sys.exit(main())
