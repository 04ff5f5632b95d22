"""`ditgate diff`'s two passes on a FLUX.1-dev-configuration pipeline with random bf16 weights and a planted fault.

The candidate is the same pipeline with one planted fault: the second half of double block 9's feed-forward input
projection (`ff.net.0.proj`) replaced by its first half, what a column shard loaded from the wrong offset gives.
Both run on one device in this process (no ranks: one GPU), through the recorder, the comparison and the locating
step `ditgate diff` uses. Reported side by side: the summary pass's wall time and peak device memory above the
weights, the bytes the same pass would hold if it kept every module's whole output, the full pass's time, and the
module named (it must be `transformer.transformer_blocks.9.ff.net.0.proj`).

    python benchmarks/diff_h200.py --device cuda --out runs/diff-h200          # the H200: 1024x1024, bf16
    python benchmarks/diff_h200.py --small --device cpu --out /tmp/diff-small  # the zoo Flux, to try it on a CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

FAULT_BLOCK = 9


def _pipeline(small: bool, device: str, dtype: str):
    if small:
        from ditgate import zoo
        from ditgate.core.loader import load

        path = zoo.materialize("flux")
        return load(path, dtype=dtype, device=device), zoo.read_meta(path)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from flux_dev_random import build

    return build(device), {"call": {"height": 1024, "width": 1024, "num_inference_steps": 28}}


def _fault(pipe, block: int):
    proj = pipe.transformer.transformer_blocks[block].ff.net[0].proj

    def wrong_offset(module, args, output):
        half = output.shape[-1] // 2
        return torch.cat([output[..., :half], output[..., :half]], dim=-1)

    return proj.register_forward_hook(wrong_offset)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    from ditgate.core import request
    from ditgate.run.diff.compare import locate, tolerance
    from ditgate.run.diff.report import plot
    from ditgate.run.diff.divergence import Recorder, capture, compare_summaries

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--small", action="store_true", help="the zoo Flux instead of the FLUX.1-dev configuration")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    on_cuda = args.device.startswith("cuda")
    start = time.perf_counter()
    pipe, meta = _pipeline(args.small, args.device, args.dtype)
    block = min(FAULT_BLOCK, len(pipe.transformer.transformer_blocks) - 1)
    req = request.build(meta)
    tol, _ = tolerance(args.dtype)
    build_s = time.perf_counter() - start
    _sync(args.device)
    weights = torch.cuda.memory_allocated() if on_cuda else None

    def record(recorder: Recorder, faulty: bool) -> Recorder:
        handle = _fault(pipe, block) if faulty else None
        try:
            return capture(pipe, req, recorder)
        finally:
            if handle is not None:
                handle.remove()

    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    base = record(Recorder(), False)
    cand = record(Recorder(reference=base.summaries, segments=base.segments), True)
    _sync(args.device)
    summary_s = time.perf_counter() - start
    summary_peak = torch.cuda.max_memory_allocated() if on_cuda else None
    lines = compare_summaries(base.summaries, cand.summaries, tol)
    first = next((i for i, x in enumerate(lines) if x["diverged"]), None)

    def rerun(full, inputs):
        b = record(Recorder(full=full, inputs=inputs), False)
        c = record(Recorder(reference=b.summaries, segments=b.segments, full=full, inputs=inputs), True)
        return b.tensors, c.tensors

    start = time.perf_counter()
    found = locate(lines, first, tol, 3, rerun) if first is not None else {"named": None, "first": None,
                                                                         "reason": "no divergence"}
    _sync(args.device)
    full_s = time.perf_counter() - start
    full_bytes = sum(torch.Size(s["shape"]).numel() * torch.empty((), dtype=getattr(torch, s["dtype"])).element_size()
                     for s in base.summaries.values() if "dtype" in s)
    expected = f"transformer.transformer_blocks.{block}.ff.net.0.proj"
    result = {
        "device": torch.cuda.get_device_name() if on_cuda else "cpu", "dtype": args.dtype,
        "model": "zoo:flux" if args.small else "FLUX.1-dev configuration, random weights",
        "transformer_params": sum(p.numel() for p in pipe.transformer.parameters()), "request": req.call,
        "build_s": round(build_s, 2), "modules_recorded": len(lines),
        "summary_pass_s": round(summary_s, 2), "full_pass_s": round(full_s, 2),
        "weights_bytes": weights,
        "summary_pass_peak_above_weights_bytes": None if weights is None else summary_peak - weights,
        "summaries_bytes": len(json.dumps(base.summaries)), "all_outputs_bytes": full_bytes,
        "named": found["named"], "expected": expected, "located": found["named"] == expected,
        "reason": found["reason"], "tolerance": tol}
    (args.out / "diff_h200.json").write_text(json.dumps(result, indent=1))
    report = {"row": "planted fault", "baseline": "baseline", "lines": lines, "first": found["first"],
              "named": found["named"], "tolerance": {"rel_max_abs": tol}}
    plot(report, args.out / "diff_h200.png")
    print(json.dumps(result, indent=1))
    if not result["located"]:
        raise SystemExit(f"the fault in {expected} was not located: {found['reason']}")


if __name__ == "__main__":
    main()
