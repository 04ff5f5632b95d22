"""The few patches cache-dit 1.5.3 needs to run ring attention, TP, TE-P and VAE-P on CPU with gloo.

Applied only in parallel workers on CPU, never on GPU, never elsewhere. Each patch names the failure it avoids;
`tests/test_compat.py` checks every failure still happens without it (when one stops happening, delete the patch).

1. ring attention asks for `aten::_scaled_dot_product_flash_attention` (for its log-sum-exp), which has no CPU kernel:
   register one that calls `_scaled_dot_product_flash_attention_for_cpu`.
2. TP / TE-P / VAE-P planners build their mesh from `torch.accelerator.current_accelerator().type`, and that is
   None on a CPU-only machine (and `cuda` for a CPU worker on a GPU machine, a twin's rank): answer `cpu`. CP's
   `enable_parallelism` reads `torch._C._get_accelerator()` instead, which a CUDA build answers `cuda` even with the
   GPU hidden from a CPU rank, then takes `rank % device_count()` of it: zero devices, ZeroDivisionError (a twin's
   cp-ulysses-2 on the GPU machine's CPU): answer `cpu` there too.
3. the ring merge calls a fused Triton/CuTe kernel that does not run on CPU: setting it to None selects
   cache-dit's own PyTorch merge.
4. Wan / Helios / LTX TP use a `DistributedRMSNorm` whose forward asserts the tensor is not on CPU: the same
   computation without the assertion.

One more applies on every device, wherever a row runs (`skip_settle_sleeps`): cache-dit's `maybe_empty_cache`,
called after it parallelizes a transformer or a text encoder and after it quantizes, sleeps one second before each
of its two collections (two seconds a row; on CPU, where its empty_cache raises, one). The collections and
empty_cache calls stay; only the sleeps go, so nothing a row computes changes.
"""

from __future__ import annotations

import importlib

import torch

_applied: list[str] = []
_library = None  # keeps the aten registration alive
RMSNORM_MODULES = ("wan", "helios", "ltx_video", "ltx2_video")


def _flash_attention_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
    empty = q.new_empty(0)
    return out, lse, empty, empty, 0, 0, empty, empty, empty


def _distributed_rms_norm_forward(self, x):
    mean_square = torch.mean(x * x, dim=-1, keepdim=True)
    torch.distributed.all_reduce(mean_square, op=torch.distributed.ReduceOp.AVG, group=self.tp_mesh.get_group())
    x = x / torch.sqrt(mean_square + self.eps)
    return x * self.weight.to(x.device) if self.elementwise_affine else x


def _cpu_accelerator(check_available: bool | None = False):
    return torch.device("cpu")


def _collect_without_sleeping():  # runs as cache_dit.utils.maybe_empty_cache, with that module's globals
    try:
        gc.collect()  # noqa: F821 - a name of cache_dit.utils
        current_platform.empty_cache()  # noqa: F821
        current_platform.ipc_collect()  # noqa: F821
    except Exception:  # noqa: BLE001 - as cache-dit's own
        pass


def skip_settle_sleeps() -> None:
    """cache-dit's maybe_empty_cache without its sleeps, for every module that imported it (the function's code is
    swapped, so the references cache-dit's modules hold, and the ones they take later, all see it)."""
    from cache_dit import utils

    if "settle-sleeps-skipped" not in _applied:
        utils.maybe_empty_cache.__code__ = _collect_without_sleeping.__code__
        _applied.append("settle-sleeps-skipped")


def apply_cpu_patches() -> list[str]:
    """Apply the patches (once per process); returns their names."""
    global _library
    if "flash-attention-cpu-kernel" in _applied:
        return list(_applied)
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("_scaled_dot_product_flash_attention", _flash_attention_for_cpu, "CPU")
    _applied.append("flash-attention-cpu-kernel")

    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "cpu":
        torch.accelerator.current_accelerator = _cpu_accelerator
        _applied.append("current-accelerator-cpu")
    if torch._C._get_accelerator().type != "cpu":
        torch._C._get_accelerator = _cpu_accelerator
        _applied.append("compiled-accelerator-cpu")

    ring = importlib.import_module("cache_dit.distributed.core._templated_ring")
    ring.fused_merge_attn_states = None
    _applied.append("ring-merge-pytorch")

    # Activate every planner before importing any planner module: cache-dit activates lazily only when its
    # registry is empty, so an early import of one module would hide all the others.
    from ditgate.core.plugin import activate_cache_dit_planners

    activate_cache_dit_planners()
    for name in RMSNORM_MODULES:
        module = importlib.import_module(f"cache_dit.distributed.transformers.{name}")
        module.DistributedRMSNorm.forward = _distributed_rms_norm_forward
    _applied.append("distributed-rmsnorm-cpu")
    return list(_applied)
