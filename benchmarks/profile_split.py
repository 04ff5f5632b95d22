"""Time split of one transformer forward on the GPU: attention kernels, GEMM kernels, everything else.

Loads the pipeline folder given (e.g. the one `benchmarks/flux_dev_random.py` writes), runs the pipeline once to
warm up, then profiles one denoising step's transformer forward with the PyTorch profiler and sums CUDA kernel time
by kernel name. Prints a JSON object; compare its shares with `ditgate flops`'s FLOP shares.

    python benchmarks/profile_split.py MODEL_DIR [--height 1024 --width 1024]
"""

from __future__ import annotations

import argparse
import json
import re

import torch

ATTENTION = re.compile(r"flash|fmha|attention|sdpa|cudnn.*(mha|sdp)", re.I)
GEMM = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_.*(mma|wgmma)|matmul", re.I)


def classify(name: str) -> str:
    if ATTENTION.search(name):
        return "attention"
    if GEMM.search(name):
        return "gemm"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()

    import ditgate
    from ditgate import zoo

    pipe = ditgate.load(args.model, dtype="bf16", device="cuda")
    call = dict(zoo.read_meta(args.model).get("call", {}), height=args.height, width=args.width,
                num_inference_steps=2, output_type="latent")
    captured = {}

    def grab(module, a, kw):
        captured.setdefault("args", (a, dict(kw)))

    handle = pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        pipe(**call, generator=torch.Generator("cpu").manual_seed(0))
    handle.remove()
    a, kw = captured["args"]
    with torch.no_grad():
        for _ in range(3):
            pipe.transformer(*a, **kw)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            pipe.transformer(*a, **kw)
            torch.cuda.synchronize()
    totals = {"attention": 0.0, "gemm": 0.0, "other": 0.0}
    names = {"attention": {}, "gemm": {}, "other": {}}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        if device_us <= 0 or event.key.startswith("ProfilerStep"):
            continue
        kind = classify(event.key)
        totals[kind] += device_us
        names[kind][event.key[:80]] = names[kind].get(event.key[:80], 0.0) + device_us
    total = sum(totals.values())
    result = {
        "forward_gpu_ms": round(total / 1000, 2),
        "share": {k: round(v / total, 4) for k, v in totals.items()},
        "top_kernels": {k: sorted(((round(t / 1000, 2), n) for n, t in v.items()), reverse=True)[:5]
                        for k, v in names.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
