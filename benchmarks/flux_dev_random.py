"""Build a FluxPipeline whose transformer has FLUX.1-dev's full configuration and random bf16 weights.

19 double-stream + 38 single-stream blocks, 24 heads x 128, joint attention dim 4096: 11.9 B parameters, the real
model's cost per step. The text encoders are one-layer stand-ins of the real widths (T5 d_model 4096, CLIP 768) and
the VAE has FLUX.1's configuration, all with seeded random weights, so the folder loads through the same
`from_pretrained(path)` as the real model and runs the same transformer work at the same sequence lengths.

    python benchmarks/flux_dev_random.py OUT_DIR [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def build(device: str = "cuda", seed: int = 0):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from ditgate.zoo.tokenizers import clip_tokenizer, t5_tokenizer

    def seeded(offset, make):
        torch.manual_seed(seed + offset)
        with torch.device(device):
            return make().to(torch.bfloat16).eval()

    transformer = seeded(0, lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=[16, 56, 56]))
    t5 = seeded(1, lambda: T5EncoderModel(T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=1, num_heads=64, feed_forward_proj="gated-gelu",
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)))
    clip = seeded(2, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=768, intermediate_size=3072,
        num_attention_heads=12, num_hidden_layers=1, vocab_size=600, projection_dim=768)))
    vae = seeded(3, lambda: AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2,
        norm_num_groups=32, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False))
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True,
                                                                  base_shift=0.5, max_shift=1.15),
                        vae=vae, text_encoder=clip, tokenizer=clip_tokenizer(), text_encoder_2=t5,
                        tokenizer_2=t5_tokenizer(max_length=512), transformer=transformer)


def build_if_missing(folder: str, extra: list[str], device: str | None = None) -> None:
    """The benchmarks' --build: write the folder in a process of its own when it holds no model yet; the device is
    `device`, else the `--device` among the benchmark's passed-on options `extra`, else cuda."""
    import subprocess
    import sys

    if (Path(folder) / "model_index.json").is_file():
        return
    if device is None:
        device = extra[extra.index("--device") + 1] if "--device" in extra else "cuda"
    subprocess.run([sys.executable, __file__, folder, "--device", device], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    start = time.perf_counter()
    pipe = build(args.device)
    params = sum(p.numel() for p in pipe.transformer.parameters())
    built = time.perf_counter()
    pipe.save_pretrained(args.out, safe_serialization=True)
    call = {"prompt": "a red cube on a wooden table, studio light", "height": 1024, "width": 1024,
            "num_inference_steps": 28, "guidance_scale": 3.5, "max_sequence_length": 512}
    (args.out / "ditgate.json").write_text(json.dumps({"modality": "image", "call": call}, indent=2) + "\n")
    print(f"transformer parameters: {params / 1e9:.2f} B; built in {built - start:.1f} s, "
          f"saved in {time.perf_counter() - built:.1f} s to {args.out}")


if __name__ == "__main__":
    main()
