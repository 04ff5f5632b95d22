"""`ditgate gate` on every input kind, with exit codes 0 (pass), 1 (fail) and 2 (bad input)."""

import json
import wave

import numpy as np
import pytest
from PIL import Image


def smooth_uint8(h=64, w=80, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([0.5 + 0.35 * np.sin(5 * xx + k) * np.cos(3 * yy - k) for k in range(3)], -1)
    return (np.clip(base + 0.01 * rng.standard_normal(base.shape), 0, 1) * 255).round().astype(np.uint8)


def garbled(image, size=20, seed=0):
    out = image.copy()
    patch = out[:size, :size].reshape(-1, 3)
    np.random.default_rng(seed).shuffle(patch)
    out[:size, :size] = patch.reshape(size, size, 3)
    return out


def save_png(path, array):
    Image.fromarray(array).save(path)
    return path


def save_wav(path, samples, rate=16000):
    pcm = (np.clip(samples, -1, 1) * 32767).round().astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


@pytest.fixture()
def images(tmp_path):
    base = smooth_uint8()
    return (save_png(tmp_path / "base.png", base), save_png(tmp_path / "same.png", base),
            save_png(tmp_path / "garbled.png", garbled(base)))


def test_images_pass_and_fail(run_cli, images):
    base, same, bad = images
    code, out, _ = run_cli("gate", "--phase", "cp", base, same)
    assert code == 0
    assert "PASS" in out and "psnr" in out and "inf dB" in out
    code, out, _ = run_cli("gate", "--phase", "cp", base, bad)
    assert code == 1
    assert "FAIL" in out
    assert "a region is corrupted: worst tile (row 0, col 0)" in out
    header = out.splitlines()[1].split()
    assert header == ["metric", "value", "threshold", "result"]


def test_json_output(run_cli, images):
    base, _, bad = images
    code, out, _ = run_cli("gate", "--phase", "cache", base, bad, "--json")
    assert code == 1
    verdict = json.loads(out)
    assert verdict["phase"] == "cache" and verdict["modality"] == "image" and verdict["passed"] is False
    assert set(verdict["metrics"]) == {"psnr", "ssim", "worst_tile_ssim"}
    assert verdict["metrics"]["psnr"] > 25
    assert {c["metric"] for c in verdict["checks"]} == {"psnr", "ssim", "worst_tile_ssim", "garbled"}


def test_frame_folders(run_cli, tmp_path):
    frames = [smooth_uint8(seed=i) for i in range(3)]
    for name, data in (("base", frames), ("same", frames), ("bad", [frames[0], garbled(frames[1]), frames[2]])):
        (tmp_path / name).mkdir()
        for i, frame in enumerate(data):
            save_png(tmp_path / name / f"frame_{i:03d}.png", frame)
    code, out, _ = run_cli("gate", "--phase", "tp", tmp_path / "base", tmp_path / "same")
    assert code == 0 and "video" in out
    code, out, _ = run_cli("gate", "--phase", "tp", tmp_path / "base", tmp_path / "bad", "--json")
    assert code == 1
    verdict = json.loads(out)
    assert verdict["modality"] == "video" and verdict["metrics"]["psnr_frame_mean"] == "inf"
    assert any("frame 1" in reason for reason in verdict["reasons"])
    (tmp_path / "bad" / "frame_002.png").rename(tmp_path / "bad" / "frame_009.png")
    code, _, err = run_cli("gate", "--phase", "tp", tmp_path / "base", tmp_path / "bad")
    assert code == 2 and "different frames" in err


def test_npy_video_and_latents(run_cli, tmp_path):
    clip = np.stack([smooth_uint8(seed=i) for i in range(3)]).astype(np.float32) / 255
    np.save(tmp_path / "clip.npy", clip)
    np.save(tmp_path / "clip_noisy.npy", np.clip(clip + 0.02 * np.random.default_rng(0).standard_normal(clip.shape),
                                                 0, 1).astype(np.float32))
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "clip.npy", tmp_path / "clip.npy", "--json")
    assert code == 0 and json.loads(out)["modality"] == "video"
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "clip.npy", tmp_path / "clip_noisy.npy")
    assert code == 1 and "worst-frame PSNR" in out

    rng = np.random.default_rng(1)
    noise = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    base = (0.5 * noise + rng.standard_normal(noise.shape)).astype(np.float32)
    np.save(tmp_path / "noise.npy", noise)
    np.save(tmp_path / "lat.npy", base)
    np.save(tmp_path / "lat_close.npy", base + np.float32(1e-6))
    np.save(tmp_path / "lat_off.npy", base + np.float32(1e-2))
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "lat.npy", tmp_path / "lat_close.npy")
    assert code == 0 and "max_abs" in out
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "lat.npy", tmp_path / "lat_off.npy")
    assert code == 1 and "latent max-abs error" in out
    code, _, err = run_cli("gate", "--phase", "cache", tmp_path / "lat.npy", tmp_path / "lat_close.npy")
    assert code == 2 and "noise" in err
    code, out, _ = run_cli("gate", "--phase", "cache", tmp_path / "lat.npy", tmp_path / "lat_close.npy",
                           "--noise", tmp_path / "noise.npy", "--json")
    assert code == 0 and json.loads(out)["metrics"]["disp_rel_error"] < 1e-5
    nan = base.copy()
    nan[0, 0, 0, 0] = np.nan
    np.save(tmp_path / "lat_nan.npy", nan)
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "lat.npy", tmp_path / "lat_nan.npy")
    assert code == 1 and "output contains NaN" in out


def test_image_with_latents(run_cli, images, tmp_path):
    base, same, _ = images
    lat = np.zeros((1, 4, 8, 8), np.float32)
    np.save(tmp_path / "a.npy", lat)
    np.save(tmp_path / "b.npy", lat + np.float32(0.5))
    code, out, _ = run_cli("gate", "--phase", "cp", base, same, "--latents", tmp_path / "a.npy", tmp_path / "b.npy")
    assert code == 1 and "max_abs" in out
    code, _, _ = run_cli("gate", "--phase", "cp", base, same, "--latents", tmp_path / "a.npy", tmp_path / "b.npy",
                         "--dtype", "bf16", "--floor", "psnr=30")
    assert code == 0  # no tensor rule in bf16: the floor's thresholds judge it


def test_wav_audio(run_cli, tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    voice = 0.3 * np.sin(2 * np.pi * 200 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    base = save_wav(tmp_path / "base.wav", voice)
    close = save_wav(tmp_path / "close.wav", voice + 0.002 * rng.standard_normal(t.size))
    noise = save_wav(tmp_path / "noise.wav", 0.3 * rng.standard_normal(t.size))
    code, out, _ = run_cli("gate", "--phase", "cp", base, close)
    assert code == 0 and "si_sdr" in out and "mel_ssim" in out
    code, out, _ = run_cli("gate", "--phase", "cp", base, noise)
    assert code == 1 and "SI-SDR" in out
    code, out, _ = run_cli("gate", "--phase", "cp", base, close, "--floor", "mel_psnr=200", "--json")
    assert code == 1 and any(c["threshold"] == 200 for c in json.loads(out)["checks"])
    code, _, err = run_cli("gate", "--phase", "cp", base, close, "--floor", "mel_psnr")
    assert code == 2 and "METRIC=VALUE" in err
    other_rate = save_wav(tmp_path / "other.wav", voice, rate=22050)
    code, _, err = run_cli("gate", "--phase", "cp", base, other_rate)
    assert code == 2 and "sample rates differ" in err


def test_bad_input_exits_2(run_cli, images, tmp_path):
    base, _, _ = images
    code, _, err = run_cli("gate", "--phase", "cp", base, tmp_path / "missing.png")
    assert code == 2 and "no such file" in err
    code, _, err = run_cli("gate", "--phase", "warp", base, base)
    assert code == 2 and "unknown phase" in err
    small = save_png(tmp_path / "small.png", smooth_uint8(32, 32))
    code, _, err = run_cli("gate", "--phase", "cp", base, small)
    assert code == 2 and "differ in shape" in err
    np.save(tmp_path / "lat.npy", np.zeros((1, 4, 8, 8), np.float32))
    code, _, err = run_cli("gate", "--phase", "cp", base, tmp_path / "lat.npy")
    assert code == 2 and "pass --modality" in err
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run_cli("gate", "--phase", "cp", tmp_path / "notes.txt", tmp_path / "notes.txt")
    assert code == 2 and "unknown kind of file" in err
    bad_table = tmp_path / "gates.json"
    bad_table.write_text("{}")
    code, _, err = run_cli("gate", "--phase", "cp", base, base, "--gates", bad_table)
    assert code == 2 and "required property" in err


def test_video_files(run_cli, tmp_path):
    frames = [Image.fromarray(smooth_uint8(seed=i)) for i in range(3)]
    frames[0].save(tmp_path / "base.gif", save_all=True, append_images=frames[1:], duration=40, loop=0)
    code, out, _ = run_cli("gate", "--phase", "cp", tmp_path / "base.gif", tmp_path / "base.gif", "--json")
    assert code == 0 and json.loads(out)["modality"] == "video"
    (tmp_path / "broken.mp4").write_bytes(b"\0" * 64)
    code, _, err = run_cli("gate", "--phase", "cp", tmp_path / "broken.mp4", tmp_path / "broken.mp4")
    assert code == 2 and "cannot decode" in err and "frames" in err


def write_row(run_dir, name, output, latents=None, noise=None, modality="image", dtype="float32"):
    """A row folder in the layout `ditgate run` writes (see ditgate.run.exec.files)."""
    folder = run_dir / "rows" / name
    folder.mkdir(parents=True)
    np.save(folder / "output.npy", output)
    if latents is not None:
        np.save(folder / "latents.npy", latents)
    if noise is not None:
        np.save(folder / "noise.npy", noise)
    (folder / "result.json").write_text(json.dumps({"name": name, "status": "ok", "modality": modality}))
    (run_dir / "run.json").write_text(json.dumps({"dtype": dtype}))
    return folder


def test_run_row_folders(run_cli, tmp_path):
    image = smooth_uint8().astype(np.float32) / 255
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    lat = (0.5 * noise + rng.standard_normal(noise.shape)).astype(np.float32)
    base = write_row(tmp_path / "run", "baseline", image, lat, noise)
    exact = write_row(tmp_path / "run", "cp-ulysses-2", image, lat + np.float32(1e-7), noise)
    drift = write_row(tmp_path / "run", "tp-2", image, lat + np.float32(1e-2), noise)
    code, out, _ = run_cli("gate", "--phase", "cp", base, exact, "--json")
    verdict = json.loads(out)
    assert code == 0 and verdict["modality"] == "image" and "max_abs" in verdict["metrics"]
    code, out, _ = run_cli("gate", "--phase", "tp", base, drift)
    assert code == 1 and "latent max-abs error" in out
    code, out, _ = run_cli("gate", "--phase", "cache", base, drift, "--json")
    assert json.loads(out)["metrics"]["disp_rel_error"] > 0  # the baseline row's noise.npy was used
    bf16 = tmp_path / "bf16"
    b = write_row(bf16, "baseline", image, lat, noise, dtype="bf16")
    d = write_row(bf16, "tp-2", image, lat + np.float32(1e-2), dtype="bf16")
    code, out, _ = run_cli("gate", "--phase", "tp", b, d)
    assert code == 1 and "calibrated floor" in out  # an exact phase in bf16 is never judged by the defaults alone
    code, _, _ = run_cli("gate", "--phase", "tp", b, d, "--floor", "psnr=30")
    assert code == 0  # the tensor rule is for float32 runs; the run's dtype comes from run.json
    code, _, _ = run_cli("gate", "--phase", "tp", b, d, "--dtype", "float32")
    assert code == 1

    t = np.arange(16000) / 16000
    wave_out = np.stack([0.3 * np.sin(2 * np.pi * 200 * t)] * 2).astype(np.float32)
    a = write_row(tmp_path / "audio", "baseline", wave_out, modality="audio")
    c = write_row(tmp_path / "audio", "rerun", wave_out, modality="audio")
    code, _, err = run_cli("gate", "--phase", "cache", a, c)
    assert code == 2 and "sample rate" in err
    code, out, _ = run_cli("gate", "--phase", "cache", a, c, "--sample-rate", "16000", "--json")
    assert code == 0 and json.loads(out)["modality"] == "audio"
