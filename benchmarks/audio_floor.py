"""The audio noise floor of zoo:stable-audio: how far a rerun, the calibration row, larger perturbations, the
default cache row, another prompt, another seed and another dtype move the output from the baseline.

Every run goes through the runner's own `run_row`, so the numbers are what `ditgate run` would gate:

    python benchmarks/audio_floor.py [--dtype bfloat16] [--device cuda] [--steps 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ditgate import zoo
from ditgate.core import request
from ditgate.core.model import Model
from ditgate.run.define import rows
from ditgate.run.exec.execute import run_row
from ditgate.metrics import audio_metrics, tensor_metrics

MODEL = "zoo:stable-audio"


def compare(base, cand) -> dict:
    scores = audio_metrics(base.output, cand.output, base.sample_rate)
    scores["cosine"] = tensor_metrics(base.latents, cand.latents)["cosine"]
    scores["identical"] = bool(np.array_equal(base.output, cand.output))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()

    path = zoo.materialize(MODEL)
    meta = zoo.read_meta(path)
    req = request.build(meta, steps=args.steps)

    def run(row, req=req, dtype=args.dtype):
        return run_row(row, Model(MODEL, path, req, dtype=dtype, device=args.device))

    cache = rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE)
    base = run(rows.BASELINE)
    cases = {
        "rerun": run(rows.BASELINE),
        "calibration (unit roundoff)": run(rows.CALIBRATION),
        "perturbed by 1e-3": run(rows.Row("p3", perturb=1e-3)),
        "perturbed by 1e-2": run(rows.Row("p2", perturb=1e-2)),
        "default cache row": run(cache),
        "another prompt": run(rows.BASELINE, request.build(meta, steps=args.steps, prompt="a violin")),
        "another seed": run(rows.BASELINE, request.build(meta, steps=args.steps, seed=1)),
        "another dtype": run(rows.BASELINE, dtype="bfloat16" if args.dtype == "float32" else "float32"),
    }
    table = {name: compare(base, out) for name, out in cases.items()}

    show = lambda v: "inf" if isinstance(v, float) and math.isinf(v) else f"{v:.4g}"  # noqa: E731
    print(f"zoo:stable-audio, {args.dtype} on {args.device}, {args.steps} steps, against the baseline\n")
    print("| run | SI-SDR (dB) | mel PSNR (dB) | mel SSIM | latent cosine | identical |")
    print("|---|---|---|---|---|---|")
    for name, s in table.items():
        print(f"| {name} | {show(s['si_sdr'])} | {show(s['mel_psnr'])} | {show(s['mel_ssim'])} | "
              f"{show(s['cosine'])} | {s['identical']} |")
    if args.json:
        clean = {k: {m: (str(v) if isinstance(v, float) and math.isinf(v) else v) for m, v in s.items()}
                 for k, s in table.items()}
        args.json.write_text(json.dumps({"dtype": args.dtype, "device": args.device, "steps": args.steps,
                                         "against_baseline": clean}, indent=1) + "\n")


if __name__ == "__main__":
    main()
