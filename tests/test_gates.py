"""The gate table (gates.json + schema) and the gate evaluator."""

import copy
import json
import math

import jsonschema
import numpy as np
import pytest

from ditgate import gates
from ditgate.core.errors import GateConfigError, GateInputError, MetricInputError, NonFiniteError

ROOT_GATES = gates.DEFAULT_GATES


def smooth(h=64, w=64, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([0.5 + 0.35 * np.sin(5 * xx + k) * np.cos(3 * yy - k) for k in range(3)], -1)
    return np.clip(base + 0.01 * rng.standard_normal(base.shape), 0, 1).astype(np.float32)


def noisy(image, scale, seed=1):
    rng = np.random.default_rng(seed)
    return np.clip(image + scale * rng.standard_normal(image.shape), 0, 1).astype(np.float32)


def garble_top_left(image, size, seed=0):
    out = image.copy()
    patch = out[:size, :size].reshape(-1, image.shape[-1])
    np.random.default_rng(seed).shuffle(patch)  # same colours, structure destroyed
    out[:size, :size] = patch.reshape(size, size, -1)
    return out


@pytest.fixture(scope="module")
def table():
    return gates.load_gates()


# ----------------------------------------------------------------------------------------------- the table


def test_gates_json_validates_against_its_schema(table):
    schema = json.loads(gates.SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(ROOT_GATES.read_text()))
    assert {"cache", "cp", "tp", "tep", "vaep", "hybrid", "quantization"} <= set(table["phases"])
    assert table["rules"]["region"]["grid"] >= 1


@pytest.mark.parametrize("breakage,field", [
    (lambda g: g["phases"]["cache"]["modalities"]["image"]["checks"][0].update(op="gt"),
     "phases/cache/modalities/image/checks/0/op"),
    (lambda g: g["phases"]["cp"]["modalities"]["video"]["checks"][1].pop("source"),
     "phases/cp/modalities/video/checks/1: 'source' is a required property"),
    (lambda g: g["phases"]["tp"]["modalities"]["image"]["checks"][0].update(metric="pnsr"),
     "phases/tp/modalities/image/checks/0/metric"),
    (lambda g: g["phases"].pop("vaep"), "'vaep' is a required property"),
    (lambda g: g["rules"]["garbled"].update(ssim_below="low"), "rules/garbled/ssim_below"),
    (lambda g: g["rules"]["region"].update(grid=0), "rules/region/grid"),
])
def test_a_broken_table_is_rejected_naming_the_field(tmp_path, table, breakage, field):
    broken = copy.deepcopy(table)
    breakage(broken)
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(GateConfigError) as info:
        gates.load_gates(path)
    assert field in str(info.value)
    with pytest.raises(GateConfigError):
        gates.evaluate("cp", "image", smooth(), smooth(), gates=broken)


def test_unreadable_tables(tmp_path):
    with pytest.raises(GateConfigError, match="not found"):
        gates.load_gates(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GateConfigError, match="not valid JSON"):
        gates.load_gates(tmp_path / "bad.json")


# ----------------------------------------------------------------------------------------------- compare


def test_compare_returns_every_metric_of_each_modality():
    image = smooth()
    assert set(gates.compare("image", image, noisy(image, 0.01))) == set(gates.METRICS["image"])
    clip = np.stack([image, image])
    assert set(gates.compare("video", clip, noisy(clip, 0.01))) == set(gates.METRICS["video"])
    latent = np.random.default_rng(0).standard_normal((1, 4, 8, 8))
    assert set(gates.compare("latent", latent, latent)) == set(gates.METRICS["latent"])
    wave = np.sin(np.arange(8000) / 7.0)
    assert set(gates.compare("audio", wave, wave, sample_rate=8000)) == set(gates.METRICS["audio"])
    with pytest.raises(GateInputError, match="sample rate"):
        gates.compare("audio", wave, wave)
    with pytest.raises(GateInputError, match="modality"):
        gates.compare("smell", wave, wave)


# ----------------------------------------------------------------------------------------------- evaluate


@pytest.mark.parametrize("phase", ["cache", "cp", "tp", "tep", "vaep", "hybrid", "quantization"])
def test_identical_outputs_pass_every_phase(phase):
    image = smooth()
    for modality, data in (("image", image), ("video", np.stack([image, image[::-1].copy()]))):
        verdict = gates.evaluate(phase, modality, data, data)
        assert verdict.passed, verdict.reasons
        assert verdict.reasons == []
        assert all(check.passed for check in verdict.checks)


def test_close_output_passes_cp_and_a_lossy_one_fails_with_reasons():
    image = smooth()
    close = noisy(image, 0.004)
    verdict = gates.evaluate("cp", "image", image, close)
    assert verdict.passed and verdict.metrics["psnr"] > 35
    lossy = noisy(image, 0.04)
    verdict = gates.evaluate("cache", "image", image, lossy)
    assert not verdict.passed
    psnr = verdict.metrics["psnr"]
    assert psnr < 30
    assert f"PSNR {psnr:.2f} dB is not > 30 dB" in verdict.reasons
    failed = [c for c in verdict.checks if not c.passed]
    assert failed[0].metric == "psnr" and failed[0].threshold == 30.0 and failed[0].source


def test_planted_garbled_patch_fails_on_worst_tile_while_psnr_stays_high():
    base = smooth(96, 96)
    cand = garble_top_left(base, 24)
    verdict = gates.evaluate("cache", "image", base, cand)
    assert verdict.metrics["psnr"] > 25.0
    assert verdict.metrics["ssim"] > 0.9
    assert not verdict.passed
    region = next(c for c in verdict.checks if c.metric == "worst_tile_ssim")
    assert not region.passed and region.value < 0.8
    assert any(r.startswith("a region is corrupted: worst tile (row 0, col 0) SSIM") and "global SSIM 0.9" in r
               for r in verdict.reasons)


def test_garbled_diagnosis_high_psnr_low_ssim():
    rng = np.random.default_rng(0)
    base = np.clip(0.5 + 0.035 * rng.standard_normal((64, 64, 3)), 0, 1).astype(np.float32)
    cand = np.clip(0.5 + 0.035 * rng.standard_normal((64, 64, 3)), 0, 1).astype(np.float32)
    verdict = gates.evaluate("cache", "image", base, cand)
    assert verdict.metrics["psnr"] >= 25 and verdict.metrics["ssim"] < 0.5
    garbled = next(c for c in verdict.checks if c.metric == "garbled")
    assert not garbled.passed and garbled.value == 1.0
    assert any(r.startswith("garbled: PSNR ") and "structure destroyed" in r for r in verdict.reasons)
    video = gates.evaluate("cp", "video", np.stack([base, base, base]), np.stack([base, cand, cand]))
    assert any(r.startswith("garbled frames 1, 2") for r in video.reasons)


def test_video_gates_use_the_worst_frame():
    frames = np.stack([smooth(seed=i) for i in range(4)])
    cand = frames.copy()
    cand[2] = noisy(frames[2], 0.02)
    verdict = gates.evaluate("cp", "video", frames, cand)
    assert not verdict.passed
    assert verdict.metrics["psnr_frame_min"] < 35 < verdict.metrics["psnr"]
    assert any(r.startswith("worst-frame PSNR") and "(frame 2)" in r for r in verdict.reasons)
    assert verdict.metrics["psnr_frame_mean"] == math.inf


def test_nan_candidate_is_a_failed_verdict_and_nan_baseline_an_error():
    image = smooth()
    broken = image.copy()
    broken[5, 5, 0] = np.nan
    verdict = gates.evaluate("cp", "image", image, broken)
    assert not verdict.passed
    assert verdict.reasons == ["output contains NaN"]
    assert verdict.metrics == {"psnr": None, "ssim": None, "worst_tile_ssim": None}
    json.dumps(verdict.to_dict(), allow_nan=False)
    infinite = image.copy()
    infinite[0, 0, 0] = np.inf
    assert gates.evaluate("cp", "image", image, infinite).reasons == ["output contains Inf"]
    with pytest.raises(NonFiniteError, match="baseline contains NaN"):
        gates.evaluate("cp", "image", broken, image)


def test_shape_mismatch_is_an_error():
    image = smooth()
    with pytest.raises(MetricInputError, match="differ in shape"):
        gates.evaluate("cp", "image", image, image[:, :60])


def test_unknown_phase_modality_and_dtype():
    image = smooth()
    with pytest.raises(GateInputError, match="unknown phase 'warp'"):
        gates.evaluate("warp", "image", image, image)
    with pytest.raises(GateInputError, match="unknown modality"):
        gates.evaluate("cp", "smell", image, image)
    with pytest.raises(GateInputError, match="unknown dtype"):
        gates.evaluate("cp", "image", image, image, dtype="int3")


# ----------------------------------------------------------------------------------------------- latents


def latents(seed=0):
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    return noise, (0.6 * noise + rng.standard_normal(noise.shape)).astype(np.float32)


def test_tensor_rule_applies_to_exact_phases_in_float32_only():
    noise, base = latents()
    cand = base + np.float32(1e-3)
    image = smooth()
    verdict = gates.evaluate("cp", "image", image, image, latents=(base, cand))
    assert not verdict.passed
    assert verdict.metrics["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    limit = 1e-4 * float(np.abs(base).max())  # the rule is relative to the baseline latents' largest magnitude
    check = next(c for c in verdict.checks if c.metric == "max_abs")
    assert check.threshold == pytest.approx(limit) and "max |baseline latents|" in check.source
    assert f"latent max-abs error 1.00e-03 is not <= {limit:g}" in verdict.reasons
    assert gates.evaluate("cp", "image", image, image, latents=(base * 100, base * 100 + np.float32(50 * limit))).passed
    assert gates.evaluate("cp", "image", image, image, latents=(base, cand), dtype="bf16").passed
    assert gates.evaluate("cp", "image", image, image, latents=(base, base + np.float32(1e-6))).passed
    assert gates.evaluate("cp", "latent", base, base).passed


def test_cache_latent_gate_needs_the_noise():
    noise, base = latents()
    rng = np.random.default_rng(3)
    close = base + 0.01 * rng.standard_normal(base.shape).astype(np.float32)
    far = base + 0.2 * rng.standard_normal(base.shape).astype(np.float32)
    with pytest.raises(GateInputError, match="noise"):
        gates.evaluate("cache", "latent", base, close)
    ok = gates.evaluate("cache", "latent", base, close, noise=noise)
    assert ok.passed and 0 < ok.metrics["disp_rel_error"] <= 0.05
    bad = gates.evaluate("cache", "latent", base, far, noise=noise)
    assert not bad.passed and bad.reasons[0].startswith("latent error relative to the baseline's move")
    nan = gates.evaluate("cache", "latent", base, np.full_like(base, np.nan), noise=noise)
    assert not nan.passed and nan.reasons == ["output contains NaN"]
    with pytest.raises(GateInputError, match="no latent gate"):
        gates.evaluate("quantization", "latent", base, base)
    with pytest.raises(GateInputError, match="not latents="):
        gates.evaluate("cp", "latent", base, base, latents=(base, base))


# ----------------------------------------------------------------------------------------------- audio


SR = 16000


def speechlike(seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(SR) / SR
    return 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 4 * t)) + 0.01 * rng.standard_normal(SR)


def test_audio_gate_uses_the_floor_defaults_and_a_calibrated_floor():
    base = speechlike()
    rng = np.random.default_rng(1)
    cand = base + 0.003 * rng.standard_normal(SR)
    verdict = gates.evaluate("cp", "audio", base, cand, sample_rate=SR)
    assert verdict.passed, verdict.reasons
    assert [c.threshold for c in verdict.checks] == [21.0, 0.75, -5.0]
    floor = {"mel_psnr": verdict.metrics["mel_psnr"] + 1.0}
    stricter = gates.evaluate("cp", "audio", base, cand, sample_rate=SR, floor=floor)
    assert not stricter.passed
    check = next(c for c in stricter.checks if c.metric == "mel_psnr")
    assert check.threshold == floor["mel_psnr"] and check.source == gates.FLOOR_SOURCE
    assert stricter.reasons[0].startswith("mel PSNR")
    garbage = gates.evaluate("cp", "audio", base, rng.standard_normal(SR) * 0.3, sample_rate=SR)
    assert not garbage.passed and len(garbage.reasons) == 3
    with pytest.raises(GateInputError, match="floor names"):
        gates.evaluate("cp", "audio", base, cand, sample_rate=SR, floor={"psnr": 30.0})
    with pytest.raises(GateInputError, match="not a finite number"):
        gates.evaluate("cp", "audio", base, cand, sample_rate=SR, floor={"si_sdr": math.inf})
    with pytest.raises(GateInputError, match="image floors exist"):
        gates.evaluate("cp", "image", smooth(), smooth(), floor={"si_sdr": 1.0})


# ----------------------------------------------------------------------------------------------- verdict


def test_verdict_to_dict_is_json_ready():
    image = smooth()
    verdict = gates.evaluate("cp", "image", image, image)
    data = verdict.to_dict()
    assert data["metrics"]["psnr"] == "inf" and data["metrics"]["ssim"] == 1.0
    assert data["checks"][0] == {"metric": "psnr", "op": ">", "threshold": 35.0, "value": "inf", "passed": True,
                                 "source": data["checks"][0]["source"]}
    assert json.loads(json.dumps(data, allow_nan=False)) == data
