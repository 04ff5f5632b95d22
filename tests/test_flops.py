"""FLOP counts of a transformer forward on the meta device, checked against counts by hand from the config."""

import json
import re
import resource
from pathlib import Path

import pytest

from ditgate.inspect.flops import profile as flops

README = Path(__file__).resolve().parents[1] / "README.md"


def _flux_hand_count(cfg: dict, image_tokens: int, text_tokens: int) -> dict[str, int]:
    """FLOPs of a FluxTransformer2DModel forward (batch 1), layer by layer from its config (2 FLOPs per MAC)."""
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    s_img, s_txt = image_tokens, text_tokens
    s = s_img + s_txt
    mlp = 4 * d  # FeedForward mult 4 and the single block's mlp_ratio 4.0
    lin = lambda rows, fan_in, fan_out: 2 * rows * fan_in * fan_out  # noqa: E731
    attention = 2 * 2 * s * s * d  # Q K^T and P V, over all heads
    double = (2 * lin(1, d, 6 * d)  # AdaLayerNormZero of both streams (on the time embedding)
              + 4 * lin(s_img, d, d) + 4 * lin(s_txt, d, d)  # Q, K, V, out of each stream
              + lin(s_img, d, mlp) + lin(s_img, mlp, d) + lin(s_txt, d, mlp) + lin(s_txt, mlp, d)  # both MLPs
              + attention)
    single = lin(1, d, 3 * d) + 3 * lin(s, d, d) + lin(s, d, mlp) + lin(s, d + mlp, d) + attention
    out_channels = cfg.get("out_channels") or cfg["in_channels"]
    outside = (lin(s_img, cfg["in_channels"], d) + lin(s_txt, cfg["joint_attention_dim"], d)
               + lin(1, 256, d) + lin(1, d, d)  # timestep embedding
               + lin(1, cfg["pooled_projection_dim"], d) + lin(1, d, d)  # pooled text embedding
               + (lin(1, 256, d) + lin(1, d, d) if cfg.get("guidance_embeds") else 0)
               + lin(1, d, 2 * d) + lin(s_img, d, cfg["patch_size"] ** 2 * out_channels))
    return {"double": double, "single": single, "outside": outside,
            "attention": attention * (cfg["num_layers"] + cfg["num_single_layers"]),
            "total": cfg["num_layers"] * double + cfg["num_single_layers"] * single + outside}


def test_zoo_flux_matches_the_hand_count(zoo_path):
    path = zoo_path("flux")
    cfg = json.loads((path / "transformer" / "config.json").read_text())
    vae = json.loads((path / "vae" / "config.json").read_text())
    meta = json.loads((path / "ditgate.json").read_text())["call"]
    scale = 2 ** (len(vae["block_out_channels"]) - 1)
    image_tokens = (meta["height"] // scale // 2) * (meta["width"] // scale // 2)
    hand = _flux_hand_count(cfg, image_tokens, meta["max_sequence_length"])

    profile = flops.analyze("zoo:flux", height=meta["height"], width=meta["width"], dtype="float32")
    assert profile.geometry.image_tokens == image_tokens
    assert profile.flops() == pytest.approx(hand["total"], rel=0.01)
    assert profile.flops("attention") == pytest.approx(hand["attention"], rel=0.01)
    by_name = profile.by_name()
    assert by_name["transformer_blocks.0"].total_flops == pytest.approx(hand["double"], rel=0.01)
    assert by_name["single_transformer_blocks.3"].total_flops == pytest.approx(hand["single"], rel=0.01)
    assert by_name["outside"].total_flops == pytest.approx(hand["outside"], rel=0.01)
    # Flux's cache adapter runs both block lists as one sequence: F1B0 always runs the first double block
    assert profile.always_run(1, 0) == ["outside", "transformer_blocks.0"]
    best = profile.cache_speedup(calls=8, cached=3, fn=1, bn=0)
    assert best["ideal"] == pytest.approx(8 * hand["total"] / (5 * hand["total"] + 3 * (hand["outside"] + hand["double"])),
                                          rel=0.01)
    assert best["ideal"] < best["ideal_steps"] == 8 / 5


def test_flux_dev_config_at_1024_counts_without_memory(tmp_path):
    config = {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "num_layers": 19,
              "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
              "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
              "axes_dims_rope": [16, 56, 56]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    profile = flops.analyze(path, height=1024, width=1024, dtype="bfloat16")
    grown_gib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20
    assert profile.weight_bytes == 2 * profile.parameters and profile.parameters == pytest.approx(11.9e9, rel=0.01)
    assert grown_gib < 2, f"the count allocated {grown_gib:.1f} GiB; its 23.8 GB of weights must stay on meta"
    hand = _flux_hand_count(config, 4096, 512)
    assert profile.flops() == pytest.approx(hand["total"], rel=0.01)
    share = profile.flops("attention") / profile.flops()
    assert share == pytest.approx(hand["attention"] / hand["total"], rel=0.01)
    print(f"FLUX.1-dev 1024x1024: {profile.flops() / 1e12:.1f} TFLOP per forward, attention {share:.1%}")
    # cache-dit's 'medium' schedule at 28 steps computes 15 of them; F1B0 keeps 1.8 % of a call on cached steps
    schedule = flops.cache_schedules(profile, 28)["schedules"]["medium"]
    assert schedule["computed"] == 15 and 1.8 < schedule["ideal"] < schedule["ideal_steps"] == 28 / 15
    assert profile.divisible(cp=8) is None and "24 attention heads" in profile.divisible(tp=16)


def test_flops_command_json_keys_are_documented(run_cli):
    code, out, _ = run_cli("flops", "zoo:flux", "--height", 128, "--width", 128, "--json")
    assert code == 0
    data = json.loads(out)
    section = README.read_text().split("### `ditgate flops`", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    assert set(data) <= documented, sorted(set(data) - documented)
    assert data["cache"]["steps"] == 8 and data["tokens"]["image"] == 1024


def test_flops_command_text_and_refusals(run_cli, tmp_path):
    code, out, _ = run_cli("flops", "zoo:wan", "--height", 64, "--width", 64, "--frames", 9)
    assert code == 0 and "WanTransformer3DModel (wan) at 9x64x64" in out and "per block list:" in out
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"_class_name": "SD3Transformer2DModel"}))
    code, _, err = run_cli("flops", other, "--height", 64, "--width", 64)
    assert code == 2 and "no FLOP model for transformer class 'SD3Transformer2DModel'" in err
    code, _, err = run_cli("flops", "zoo:wan", "--height", 60, "--width", 64, "--frames", 9)
    assert code == 2 and "do not divide" in err
