"""Each CPU patch in ditgate.run.exec.compat exists because cache-dit 1.5.3 fails without it on CPU.

The `test_still_needed_*` tests check that the failure is still there. When one of them fails after an upgrade,
the patch it guards is no longer needed: delete the patch and its test.
"""

import inspect
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the patches are for CPU-only machines")


def _in_fresh_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_still_needed_flash_attention_has_no_cpu_kernel():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)


def test_still_needed_no_current_accelerator_on_cpu():
    assert torch.accelerator.current_accelerator() is None


def test_still_needed_ring_merge_kernel_is_not_pytorch():
    from cache_dit.distributed.core import _templated_ring

    assert _templated_ring.fused_merge_attn_states is not None


def test_still_needed_rmsnorm_asserts_not_cpu():
    import importlib

    from ditgate.run.exec.compat import RMSNORM_MODULES

    for name in RMSNORM_MODULES:
        module = importlib.import_module(f"cache_dit.distributed.transformers.{name}")
        assert '!= "cpu"' in inspect.getsource(module.DistributedRMSNorm.forward), name


@pytest.mark.full  # a fresh process importing cache-dit: 20 s under load
def test_a_cpu_rank_where_the_build_reports_a_gpu_gets_the_cpu_device():
    """cache-dit's enable_parallelism (CP) takes `rank % device_count()` of `torch._C._get_accelerator()`, which a
    CUDA build answers `cuda` on a CPU rank whose GPU is hidden: zero devices, ZeroDivisionError (a twin's
    cp-ulysses-2 on a GPU machine's CPU). Reproduced here by having the accelerator report cuda with no device."""
    from cache_dit.distributed.core import _runtime

    assert "torch._C._get_accelerator().type" in inspect.getsource(_runtime)  # else delete the patch
    code = """
import torch
torch._C._get_accelerator = lambda check=None: torch.device("cuda")  # a CUDA build, its GPU hidden from this rank
def device(rank=1):  # cache-dit's own expression in enable_parallelism
    device_type = torch._C._get_accelerator().type
    return torch.device(device_type, rank % torch.get_device_module(device_type).device_count())
try:
    device()
    raise SystemExit("no error without the patch")
except ZeroDivisionError:
    pass
from ditgate.run.exec import compat
assert "compiled-accelerator-cpu" in compat.apply_cpu_patches()
print("ok", device())
"""
    done = _in_fresh_process(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok cpu" in done.stdout


def test_patches_work_in_a_fresh_process():
    code = """
import torch
from ditgate.run.exec import compat
names = compat.apply_cpu_patches()
assert compat.apply_cpu_patches() == names  # once per process
q, k, v = torch.randn(3, 1, 2, 8, 16).unbind(0)
out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[:2]
torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
assert lse.shape == (1, 2, 8)
assert torch.accelerator.current_accelerator().type == "cpu"
from cache_dit.distributed.core import _templated_ring
assert _templated_ring.fused_merge_attn_states is None
from cache_dit.distributed.transformers.dispatch import ContextParallelismPlannerRegister as C
from cache_dit.distributed.transformers.register import TensorParallelismPlannerRegister as T
C.get_planner("FluxTransformer2DModel"); T.get_planner("WanTransformer3DModel")  # every planner still registered
print("ok", names)
"""
    done = _in_fresh_process(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout


@pytest.mark.full
def test_settle_sleeps_still_there_and_skipped_by_the_patch():
    """cache-dit's maybe_empty_cache still sleeps (else delete compat.skip_settle_sleeps); after the patch every
    reference to it, one taken before and one a module takes later, collects without sleeping."""
    code = """
import gc, time
from cache_dit import utils
from cache_dit.distributed import dispatch  # holds a reference taken at its import
start = time.perf_counter(); utils.maybe_empty_cache(); slept = time.perf_counter() - start
assert slept >= 0.9, slept
from ditgate.run.exec import compat
compat.skip_settle_sleeps(); compat.skip_settle_sleeps()
class Cycle: pass
a = Cycle(); a.me = a; del a
before = gc.get_count()
start = time.perf_counter(); dispatch.maybe_empty_cache(); took = time.perf_counter() - start
assert took < 0.5, took
from cache_dit.distributed.transformers import flux2  # imported after the patch
start = time.perf_counter(); flux2.maybe_empty_cache(); assert time.perf_counter() - start < 0.5
assert not any(isinstance(o, Cycle) for o in gc.get_objects())  # the collection still ran
print("ok", round(slept, 2), round(took, 3))
"""
    done = _in_fresh_process(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout
