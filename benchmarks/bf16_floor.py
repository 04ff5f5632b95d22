"""The calibrated floor of real-sized models in bfloat16: a FLUX.1-dev-config and a Wan2.1-1.3B-config pipeline with
random weights, each run as the baseline, the calibration row and the default cache row through the runner's own
`run_row`, so the numbers are what `ditgate run --dtype bf16` would gate:

- the floor at the first step (the transformer's first output, per latent frame for Wan) and at the end (the
  decoded output; per frame for Wan), with the thresholds gates.json `rules.reduced_precision` derives from it;
- the cache row against the baseline, next to the floor and the cache gate the floor gives;
- the wall time the calibration row adds (it is one more single-device run of the baseline).

    python benchmarks/bf16_floor.py --device cuda --flux-steps 28 --wan-steps 10 --json out.json   # one H200
    python benchmarks/bf16_floor.py --device cpu                                                   # smoke

On a GPU the models have the real configurations (FLUX.1-dev: benchmarks/flux_dev_random.py, 1024 x 1024; Wan2.1
1.3B: 30 blocks, 12 heads x 128, 81 x 480 x 832); on a CPU the zoo's tiny flux and wan stand in at their own sizes,
to check that the script runs. The two-GPU CP rows wait for a machine with several GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ditgate import gates, zoo
from ditgate.core import request
from ditgate.core.model import Model
from ditgate.gates import floor as floor_rule
from ditgate.gates.first_step import summary
from ditgate.metrics import score_frames, tensor_metrics
from ditgate.run.define import rows
from ditgate.run.exec.execute import run_row
from ditgate.run.exec.isolation import Pristine

DTYPE = "bfloat16"
CACHE = rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE, description="the default cache row")


def build_wan_1_3b(device: str, seed: int = 0):
    """WanPipeline with Wan2.1-T2V-1.3B's transformer and VAE configurations and random bf16 weights; the UMT5
    encoder is a one-layer stand-in of the real width (4096)."""
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from ditgate.zoo.tokenizers import t5_tokenizer

    def seeded(offset, make):
        torch.manual_seed(seed + offset)
        with torch.device(device):
            return make().to(torch.bfloat16).eval()

    transformer = seeded(0, lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024))
    umt5 = seeded(1, lambda: UMT5EncoderModel(UMT5Config(
        vocab_size=256, d_model=4096, d_kv=64, d_ff=10240, num_layers=1, num_heads=64,
        relative_attention_num_buckets=32, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)))
    vae = seeded(2, lambda: AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                             temperal_downsample=[False, True, True]))
    vae = vae.to(torch.float32)  # Wan's VAE runs in float32 in the reference pipeline
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5, vae=vae, transformer=transformer,
                       scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                         flow_shift=3.0))


def models(device: str, flux_steps: int, wan_steps: int):
    """(name, pipeline or zoo path, request, modality) of each model."""
    if device == "cpu":  # the smoke test: the zoo's tiny models at their own sizes
        out = []
        for name, steps in (("zoo:flux", flux_steps), ("zoo:wan", wan_steps)):
            path = zoo.materialize(name)
            out.append((name, path, request.build(zoo.read_meta(path), steps=steps)))
        return out
    from flux_dev_random import build as build_flux

    flux = request.build({"call": {"prompt": "a red cube on a wooden table, studio light", "height": 1024,
                                   "width": 1024, "guidance_scale": 3.5, "max_sequence_length": 512}},
                         steps=flux_steps)
    wan = request.build({"call": {"prompt": "a cat walks on the grass, realistic", "height": 480, "width": 832,
                                  "num_frames": 81, "guidance_scale": 5.0}}, steps=wan_steps)
    return [("FLUX.1-dev config, random weights", lambda: build_flux(device), flux),
            ("Wan2.1-1.3B config, random weights", lambda: build_wan_1_3b(device), wan)]


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def measure(name, source, req, device: str) -> dict:
    if callable(source):
        start = time.perf_counter()
        pristine, path = Pristine(source(), device, load_s=time.perf_counter() - start), Path(".")
    else:
        pristine, path = None, source

    def run(row):
        start = time.perf_counter()
        outcome = run_row(row, Model(name, path, req, dtype=DTYPE, device=device), pristine=pristine)
        return outcome, time.perf_counter() - start

    (base, base_s), (calib, calib_s), (cache, cache_s) = run(rows.BASELINE), run(rows.CALIBRATION), run(CACHE)
    modality = base.modality
    table = gates.load_gates()
    rule = floor_rule.rule(table)
    first = summary(base.first_step, calib.first_step)
    final = gates.compare(modality, base.output, calib.output)
    frames = score_frames(base.output, calib.output) if modality == "video" else None
    cache_scores = gates.compare(modality, base.output, cache.output)
    latents = {"calibration": tensor_metrics(base.latents, calib.latents, base.noise),
               "cache": tensor_metrics(base.latents, cache.latents, base.noise)}
    exact_checks = table["phases"]["cp"]["modalities"][modality]["checks"] + table["rules"]["region"]["checks"]
    cache_checks = table["phases"]["cache"]["modalities"][modality]["checks"] + table["rules"]["region"]["checks"]
    result = {
        "model": name, "modality": modality, "steps": req.steps, "size": {k: req.call.get(k) for k in (
            "num_frames", "height", "width") if k in req.call},
        "first_step_floor": {"psnr_per_frame": first["psnr"], "ssim_per_frame": first["ssim"],
                             "psnr_frame_min": first["psnr_frame_min"], "ssim_frame_min": first["ssim_frame_min"],
                             "threshold_db": (first["psnr_frame_min"] - rule["first_step"]["margin_db"])},
        "final_floor": final | ({"psnr_per_frame": [float(x) for x in frames.psnr],
                                 "ssim_per_frame": [float(x) for x in frames.ssim]} if frames is not None else {}),
        "exact_thresholds": floor_rule.thresholds(exact_checks, final, rule["final"], exact=True)["used"],
        "cache": cache_scores,
        "cache_thresholds": floor_rule.thresholds(cache_checks, final, rule["final"], exact=False)["used"] or
        {c["metric"]: c["value"] for c in cache_checks},
        "latents": latents,
        "cache_latent_threshold": max(
            next(c["value"] for c in table["phases"]["cache"]["modalities"]["latent"]["checks"]),
            rule["cache_latents"]["factor"] * latents["calibration"]["disp_rel_error"]),
        "wall_s": {"baseline": base_s, "calibration": calib_s, "cache": cache_s},
        "calibration_added_fraction_of_baseline": calib_s / base_s if base_s else None,
    }
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return json.loads(json.dumps(result, default=_finite), parse_constant=str)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--flux-steps", type=int, default=None, help="(default: 28 on a GPU, the zoo's on a CPU)")
    parser.add_argument("--wan-steps", type=int, default=None, help="(default: 10 on a GPU, the zoo's on a CPU)")
    parser.add_argument("--only", choices=("flux", "wan"), help="one model only")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # bfloat16 on a CPU: one thread is about ten times faster than two
    gpu = args.device != "cpu"
    flux_steps = args.flux_steps or (28 if gpu else None)
    wan_steps = args.wan_steps or (10 if gpu else None)
    results = []
    for name, source, req in models(args.device, flux_steps, wan_steps):
        if args.only and args.only not in name.lower():
            continue
        results.append(measure(name, source, req, args.device))
        r = results[-1]
        main_metric = "psnr_frame_min" if r["modality"] == "video" else "psnr"
        print(f"{r['model']} ({r['steps']} steps, {r['size']}), {DTYPE} on {args.device}")
        print(f"  first-step floor: worst frame {r['first_step_floor']['psnr_frame_min']} dB "
              f"(first-step threshold {r['first_step_floor']['threshold_db']} dB); per frame "
              f"{np.round(np.array(r['first_step_floor']['psnr_per_frame'], dtype=float), 2).tolist()}")
        print(f"  final floor: {main_metric} {r['final_floor'][main_metric]}, ssim {r['final_floor']['ssim']}; "
              f"exact rows must reach {r['exact_thresholds']}")
        print(f"  cache row: {main_metric} {r['cache'][main_metric]}, disp_rel {r['latents']['cache']['disp_rel_error']}"
              f" (floor {r['latents']['calibration']['disp_rel_error']}, cache latent threshold "
              f"{r['cache_latent_threshold']}); cache gate {r['cache_thresholds']}")
        print(f"  wall: baseline {r['wall_s']['baseline']:.1f} s, calibration {r['wall_s']['calibration']:.1f} s "
              f"added, cache {r['wall_s']['cache']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "dtype": DTYPE, "torch": torch.__version__,
                                         "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
