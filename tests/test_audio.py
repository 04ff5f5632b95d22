"""The audio route end to end on zoo:stable-audio: layout, runner rows, wav files, gates and the noise floor."""

import copy
import json
import math
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import ditgate
from ditgate import zoo
from ditgate.run.exec import audio
from ditgate.gates import calibration
from ditgate import gates
from ditgate.core import request
from ditgate.run.define import rows
from ditgate.run.exec.execute import run_row
from ditgate.run.exec.probes import Probes
from ditgate.core.model import Model
from ditgate.run.runner import RunConfig, run

PLUGINS = Path(__file__).parent / "plugins"
MODEL = "zoo:stable-audio"


@pytest.fixture(scope="module")
def pipe():
    return ditgate.load(MODEL)


def _model(**options):
    return Model.open(MODEL, **options)


def _run(out, selected, rows_list=rows.DEFAULT_ROWS, dtype="auto", **kwargs):
    cfg = RunConfig(model=_model(dtype=dtype), rows=rows.select(rows_list, selected), out=out, **kwargs)
    return run(cfg, progress=lambda line: None)


def _rows(report):
    return {r["name"]: r for r in report["rows"]}


# ------------------------------------------------------------------------------------------- layout and duration


def test_zoo_model_has_the_stable_audio_layout(pipe):
    seen = []
    pipe.transformer.transformer_blocks[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(tuple(kwargs["hidden_states"].shape)), with_kwargs=True)
    call = zoo.get(MODEL).call
    out = pipe(**call, generator=torch.Generator().manual_seed(0), output_type="np")
    latent = pipe(**call, generator=torch.Generator().manual_seed(0), output_type="latent").audios
    assert audio.sample_rate(pipe) == 44100 and audio.hop_length(pipe) == 512
    assert tuple(latent.shape) == (1, 8, 31)  # the fixed window, whatever the duration
    assert seen[0] == (2, 32, 64)  # batched guidance; 31 latent frames + 1 global token
    assert out.audios.shape == (1, 2, int(call["audio_end_in_s"] * 44100))  # cropped to the request


def test_duration_maps_to_latent_frames_and_back(pipe):
    assert audio.window_seconds(pipe) == 31 * 512 / 44100
    assert audio.seconds_to_latent_frames(pipe, 0.25) == 22  # 11025 samples need 22 frames of 512
    assert audio.seconds_to_latent_frames(pipe, 0.0) == 0
    for frames in range(64):
        assert audio.seconds_to_latent_frames(pipe, audio.latent_frames_to_seconds(pipe, frames)) == frames
    for seconds in np.linspace(0.0, 2.0, 97):
        frames = audio.seconds_to_latent_frames(pipe, float(seconds))
        assert audio.latent_frames_to_seconds(pipe, frames) >= seconds - 1 / 44100
        assert audio.latent_frames_to_seconds(pipe, frames - 1) < seconds if frames else True
    with pytest.raises(ValueError, match="seconds"):
        audio.seconds_to_latent_frames(pipe, -1.0)
    with pytest.raises(audio.AudioLayoutError, match="vae"):
        audio.hop_length(object())


def test_wav_file_is_valid_pcm(tmp_path):
    t = np.arange(4000) / 8000
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 1.5 * np.sin(2 * np.pi * 220 * t)])  # 2nd clips
    path = audio.write_wav(tmp_path / "x.wav", stereo, 8000)
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (2, 2, 8000, 4000)
        pcm = np.frombuffer(w.readframes(4000), dtype="<i2").reshape(-1, 2).T
    np.testing.assert_array_equal(pcm, np.round(np.clip(stereo, -1, 1) * 32767))
    with pytest.raises(ValueError, match="NaN"):
        audio.wav_bytes(np.full((1, 10), np.nan), 8000)
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


# ------------------------------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def audio_report(tmp_path_factory):
    """baseline, the default cache row, and a row whose transformer outputs carry 50% noise (damaged audio)."""
    noisy = rows.Row("noisy", "cache", perturb=0.5, description="every transformer output with 50% noise")
    return _run(tmp_path_factory.mktemp("audio") / "run", "cache,noisy", [*rows.DEFAULT_ROWS, noisy])


def test_cache_row_passes_the_audio_gates(audio_report):
    by_name = _rows(audio_report)
    cache = by_name["cache"]
    assert cache["status"] == "passed", cache["reasons"]
    assert cache["modality"] == "audio"
    checks = [c["metric"] for c in cache["verdict"]["checks"]]
    assert checks == ["cosine", "mel_psnr", "mel_ssim", "si_sdr"]  # the latent check first, never an image gate
    assert cache["facts"]["cache"][0]["cached_steps"] == [2, 4, 6]
    assert cache["facts"]["calls_per_step"] == 1.0  # guidance is batched into one call
    assert cache["facts"]["block_seq_len"]["transformer.transformer_blocks"] == 32


def test_damaged_row_fails_the_audio_gates(audio_report):
    noisy = _rows(audio_report)["noisy"]
    assert noisy["status"] == "failed" and not audio_report["passed"]
    failed = {c["metric"] for c in noisy["verdict"]["checks"] if not c["passed"]}
    assert {"cosine", "mel_ssim"} <= failed, noisy["reasons"]
    assert noisy["reasons"][0].startswith("latent cosine similarity")
    assert noisy["facts"]["perturbed_calls"] == 8


def test_rows_leave_latents_noise_and_a_wav_file(audio_report):
    run_dir = Path(audio_report["run_dir"])
    for name in ("baseline", "cache", "calibration"):
        folder = run_dir / "rows" / name
        output = np.load(folder / "output.npy")
        assert output.shape == (2, 11025)
        assert np.load(folder / "latents.npy").shape == np.load(folder / "noise.npy").shape == (1, 8, 31)
        with wave.open(str(folder / "output.wav")) as w:
            assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 44100, 11025)
            pcm = np.frombuffer(w.readframes(11025), dtype="<i2").reshape(-1, 2).T
        np.testing.assert_allclose(pcm / 32767, output, atol=1 / 32767)
    table = (run_dir / "report.md").read_text()
    assert "0-0.25 s of audio" in table and "## Audio" in table and "| calibration |" in table
    assert not (run_dir / "grid.png").exists()  # nothing to draw: every row is audio


def test_calibration_measures_a_floor_and_the_defaults_stay(audio_report):
    by_name = _rows(audio_report)
    measured = by_name["calibration"]["metrics"]
    assert by_name["calibration"]["status"] == "reference"
    assert all(isinstance(measured[m], float) and math.isfinite(measured[m]) for m in ("si_sdr", "mel_psnr"))
    assert measured["si_sdr"] > 80  # float32 rounding noise: a floor far tighter than the defaults
    floor = by_name["cache"]["verdict"]["floor"]
    assert floor["measured"]["si_sdr"] == measured["si_sdr"] and floor["used"] is None
    defaults = {c["metric"]: c["value"] for c in gates.load_gates()["rules"]["audio"]["checks"]}
    assert {c["metric"]: c["threshold"] for c in by_name["cache"]["verdict"]["checks"][1:]} == defaults


def test_wav_files_gate_with_the_cli(audio_report, run_cli):
    rows_dir = Path(audio_report["run_dir"]) / "rows"
    code, out, _ = run_cli("gate", "--phase", "cache", rows_dir / "baseline" / "output.wav",
                           rows_dir / "cache" / "output.wav", "--json")
    assert code == 0 and json.loads(out)["modality"] == "audio"
    code, out, _ = run_cli("gate", "--phase", "cache", rows_dir / "baseline" / "output.wav",
                           rows_dir / "noisy" / "output.wav", "--latents", rows_dir / "baseline" / "latents.npy",
                           rows_dir / "noisy" / "latents.npy")
    assert code == 1 and "latent cosine similarity" in out


def test_wrong_forward_pattern_plugin_fails(tmp_path):
    report = _run(tmp_path / "run", "cache", integration=PLUGINS / "stable_audio_wrong_pattern.py")
    cache = _rows(report)["cache"]
    assert not report["passed"] and cache["status"] == "error"
    assert "ForwardPattern" in cache["reasons"][0]
    assert "calibration" not in _rows(report)  # no audio row was gated: no floor to measure


# ------------------------------------------------------------------------------------------------- calibration


@pytest.mark.full
def test_calibration_is_deterministic_on_cpu():
    model = _model()
    first = run_row(rows.CALIBRATION, model)
    second = run_row(rows.CALIBRATION, model, warmup=1)  # the noise starts again from the seed on every call
    base = run_row(rows.BASELINE, model)
    np.testing.assert_array_equal(first.output, second.output)
    np.testing.assert_array_equal(first.latents, second.latents)
    assert not np.array_equal(first.output, base.output)  # the perturbation acted
    assert first.facts["perturbed_calls"] == model.request.steps and first.sample_rate == 44100


def test_calibration_row_follows_gates_json():
    rule = gates.load_gates()["rules"]["audio"]["calibration"]
    assert rule["row"] == rows.CALIBRATION.name and rule["perturb"] == rows.CALIBRATION.perturb
    assert rows.CALIBRATION.name in rows.REFERENCE_ROWS
    assert [r.name for r in rows.select(rows.DEFAULT_ROWS, "calibration")] == ["baseline", "calibration"]


@pytest.mark.parametrize("dtype, size", [(torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8),
                                         (torch.float16, 2.0 ** -11)])
def test_unit_roundoff(dtype, size):
    assert calibration.unit_roundoff(dtype) == size


class _Returns(torch.nn.Module):
    """A stand-in transformer whose forward returns `wrap(x)`: a tensor, a tuple or a diffusers output."""

    def __init__(self, wrap):
        super().__init__()
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(x)


class _Pipe:
    def __init__(self, transformer):
        self.components = {"transformer": transformer}


@pytest.mark.parametrize("wrap, unwrap", [
    (lambda x: x, lambda out: out),
    (lambda x: (x, torch.arange(3)), lambda out: out[0]),
    (lambda x: __import__("diffusers").models.modeling_outputs.Transformer2DModelOutput(sample=x),
     lambda out: out.sample),
])
def test_output_noise_reaches_every_output_type(wrap, unwrap):
    x = torch.ones(3, 4)

    def noisy(size, seed):
        model = _Returns(wrap)
        hooks = calibration.OutputNoise(size, seed).attach(_Pipe(model))
        out = model(x)
        hooks.detach()
        assert type(out) is type(wrap(x)) and hooks.calls == 1
        return unwrap(out)

    assert torch.equal(noisy(0.1, 0), noisy(0.1, 0)) and not torch.equal(noisy(0.1, 0), noisy(0.1, 1))
    assert 0 < (noisy(0.1, 0) - x).abs().max() < 1
    assert 0 < (noisy("unit_roundoff", 0) - x).abs().max() < 1e-6


def test_gate_floor_only_widens_the_gate():
    measured = {"si_sdr": 90.0, "mel_psnr": 15.0, "mel_ssim": math.inf}
    assert calibration.gate_floor(measured) == {"mel_psnr": 15.0}  # looser than 21 dB; the others stay default
    table = copy.deepcopy(gates.load_gates())
    table["rules"]["audio"]["calibration"]["use"] = "replace"
    assert calibration.gate_floor(measured, table) == {"si_sdr": 90.0, "mel_psnr": 15.0}


# ------------------------------------------------------------------------------------------------------ gates


def _waves(seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(44100 // 4) / 44100
    base = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    return base[None], (base + 0.001 * rng.standard_normal(t.size))[None]


@pytest.mark.parametrize("phase, dtype, latent_metric", [
    ("cache", "float32", "cosine"),  # lossy: the audio latent check, not the image-measured disp_rel_error
    ("cp", "float32", "max_abs"),  # exact in float32: the tensor rule
    ("cp", "bfloat16", "cosine"),  # exact, but no tensor rule in half precision: the audio latent check
])
def test_audio_latent_checks(phase, dtype, latent_metric):
    base, cand = _waves()
    lat = np.random.default_rng(2).standard_normal((1, 8, 31))
    verdict = gates.evaluate(phase, "audio", base, cand, latents=(lat, lat + 1e-6), dtype=dtype, sample_rate=44100)
    assert verdict.passed, verdict.reasons
    metrics = [c.metric for c in verdict.checks]
    assert metrics[0] == latent_metric and "psnr" not in metrics and "ssim" not in metrics
    far = gates.evaluate(phase, "audio", base, cand, latents=(lat, -lat), dtype=dtype, sample_rate=44100)
    assert not far.passed and far.reasons[0].startswith("latent")


def test_initial_noise_drops_the_guidance_copy():
    probes = Probes()
    probes.latents = torch.randn(1, 8, 31)
    start = torch.randn(1, 8, 31)
    probes.noise = torch.cat([start, start])
    assert torch.equal(probes.initial_noise(), start)
    probes.noise = torch.randn(2, 8, 31)  # two different inputs: no copy to drop
    assert probes.initial_noise() is None
    probes.noise = start  # no guidance batch: the input as it is
    assert probes.initial_noise() is start
    probes.noise = None
    assert probes.initial_noise() is None


@pytest.mark.parametrize("value", ["half", -1.0, 0, True, float("nan")])
def test_bad_perturb_is_refused(value):
    with pytest.raises(rows.RowError, match="perturb"):
        rows.from_mapping({"name": "x", "perturb": value})
