"""Metrics: PSNR/SSIM against scikit-image and torchmetrics, input handling, refusals, tensor and audio metrics."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from ditgate import metrics
from ditgate.core.errors import MetricInputError, NonFiniteError
from ditgate.metrics import audio
from ditgate.metrics.convert import as_frames
from ditgate.metrics.kernel import RADIUS

SK_SSIM = dict(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1.0)


def smooth_image(h, w, c=3, seed=0, noise=0.003):
    """A smooth, low-variance image: the hard case for float32 SSIM (large means, tiny local variances)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([0.5 + 0.4 * np.sin(5 * xx + k) * np.cos(3 * yy - k) for k in range(c)], -1)
    return np.clip(base + noise * rng.standard_normal(base.shape), 0, 1).astype(np.float32)


def perturbed(image, scale, seed=1):
    rng = np.random.default_rng(seed)
    return np.clip(image + scale * rng.standard_normal(image.shape), 0, 1).astype(np.float32)


def sk_ssim(a, b):
    """scikit-image's Gaussian SSIM in float64 (a, b: HWC or HW float32 arrays)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return structural_similarity(a, b, channel_axis=-1 if a.ndim == 3 else None, **SK_SSIM)


# ----------------------------------------------------------------------------------------------- PSNR


def test_two_random_uint8_images_score_below_10_db():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    value = metrics.psnr(a, b)
    assert value < 10.0  # uint8 subtraction without a cast wraps and gives about 28 dB
    assert value == pytest.approx(peak_signal_noise_ratio(a / 255.0, b / 255.0, data_range=1.0), abs=1e-6)


def test_identical_inputs_give_inf_and_one():
    image = smooth_image(40, 56)
    assert metrics.psnr(image, image) == math.inf
    assert metrics.ssim(image, image) == 1.0
    assert metrics.worst_tile_ssim(image, image, grid=4) == 1.0
    scores = metrics.score_frames(np.stack([image] * 3), np.stack([image] * 3), grid=2)
    assert np.all(scores.psnr == math.inf) and np.all(scores.ssim == 1.0) and np.all(scores.tiles == 1.0)


def test_psnr_matches_scikit_image_and_is_symmetric():
    a = smooth_image(48, 64)
    b = perturbed(a, 0.05)
    expected = peak_signal_noise_ratio(a.astype(np.float64), b.astype(np.float64), data_range=1.0)
    assert metrics.psnr(a, b) == pytest.approx(expected, abs=1e-6)
    assert metrics.psnr(a, b) == metrics.psnr(b, a)


def test_uint8_and_float_versions_give_the_same_numbers():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    as_uint8 = metrics.score_frames(a, b, grid=3)
    as_unit = metrics.score_frames(a.astype(np.float32) / 255, b.astype(np.float32) / 255, grid=3)
    as_255 = metrics.score_frames(a.astype(np.float64), b.astype(np.float64), grid=3, value_range=(0, 255))
    for other in (as_unit, as_255):
        np.testing.assert_array_equal(as_uint8.mse, other.mse)
        np.testing.assert_allclose(as_uint8.tiles, other.tiles, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------- SSIM


@pytest.mark.parametrize("shape,kind", [
    ((64, 64, 3), "random"), ((37, 91), "random"), ((120, 50, 3), "random"), ((11, 11), "random"),
    ((96, 160, 3), "smooth"), ((130, 70, 1), "smooth"), ((201, 64), "smooth"),
])
def test_ssim_within_1e6_of_scikit_image(shape, kind):
    rng = np.random.default_rng(sum(shape))
    if kind == "random":
        a = rng.random(shape).astype(np.float32)
        b = perturbed(a, 0.1)
    else:
        a = smooth_image(shape[0], shape[1], shape[2] if len(shape) == 3 else 1)
        a = a if len(shape) == 3 else a[..., 0]
        b = perturbed(a, 0.004)
    assert metrics.ssim(a, b) == pytest.approx(sk_ssim(a, b), abs=1e-6)
    assert metrics.ssim(b, a) == pytest.approx(metrics.ssim(a, b), abs=1e-6)


def test_torchmetrics_agrees_once_its_border_is_cropped():
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    a = smooth_image(64, 96)
    b = perturbed(a, 0.05)
    nchw = lambda x: torch.from_numpy(x).permute(2, 0, 1)[None].double()  # noqa: E731
    whole, full_map = tm_ssim(nchw(b), nchw(a), gaussian_kernel=True, sigma=1.5, kernel_size=11, data_range=1.0,
                              return_full_image=True)
    cropped = float(full_map[..., RADIUS:-RADIUS, RADIUS:-RADIUS].mean())
    ours = metrics.ssim(a, b)
    assert ours == pytest.approx(cropped, abs=1e-6)
    assert abs(float(whole) - ours) > 1e-5  # torchmetrics' own mean includes the reflected border


def test_batched_video_equals_frame_by_frame_and_every_input_form():
    rng = np.random.default_rng(5)
    base = (np.stack([smooth_image(40, 64, seed=i) for i in range(5)]) * 255).round().astype(np.uint8)
    cand = np.clip(base.astype(int) + rng.integers(-12, 13, base.shape), 0, 255).astype(np.uint8)
    cand[2] = base[2]
    clip = metrics.score_frames(base, cand, grid=2)
    for i in range(5):
        one = metrics.score_frames(base[i], cand[i], grid=2)
        assert one.mse[0] == clip.mse[i]
        np.testing.assert_allclose(one.tiles[0], clip.tiles[i], rtol=0, atol=1e-12)
        assert clip.ssim[i] == pytest.approx(sk_ssim(base[i] / 255.0, cand[i] / 255.0), abs=1e-6)
    nchw = metrics.score_frames(torch.from_numpy(base).permute(0, 3, 1, 2), torch.from_numpy(cand).permute(0, 3, 1, 2),
                                grid=2)
    pil = metrics.score_frames([Image.fromarray(f) for f in base], [Image.fromarray(f) for f in cand], grid=2)
    for other in (nchw, pil):
        np.testing.assert_array_equal(other.mse, clip.mse)
        np.testing.assert_allclose(other.tiles, clip.tiles, rtol=0, atol=1e-12)
    summary = metrics.video_metrics(clip)
    assert summary["psnr_frame_min"] == pytest.approx(clip.psnr.min())
    assert summary["psnr_frame_mean"] == math.inf  # frame 2 is identical
    assert math.isfinite(summary["psnr"]) and summary["psnr"] > summary["psnr_frame_min"]
    assert summary["ssim"] == pytest.approx(clip.ssim.mean()) and summary["ssim_frame_min"] == clip.ssim.min()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_path_equals_cpu_path():
    base = np.stack([smooth_image(96, 128, seed=i) for i in range(6)])
    cand = perturbed(base, 0.01)
    cpu = metrics.score_frames(base, cand, grid=4)
    gpu = metrics.score_frames(base, cand, grid=4, device="cuda")
    np.testing.assert_allclose(gpu.ssim, cpu.ssim, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu.tiles, cpu.tiles, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu.psnr, cpu.psnr, rtol=0, atol=1e-6)


def test_worst_tile_finds_a_garbled_top_left_patch_the_mean_hides():
    base = smooth_image(96, 96, noise=0.0)
    cand = base.copy()
    rng = np.random.default_rng(0)
    patch = cand[:24, :24].reshape(-1, 3)
    rng.shuffle(patch)  # same colours, structure destroyed
    cand[:24, :24] = patch.reshape(24, 24, 3)
    scores = metrics.score_frames(base, cand, grid=4)
    worst = scores.worst_tile()
    assert (worst.row, worst.col) == (0, 0)
    assert worst.value < 0.5 < 0.9 < scores.ssim[0]
    assert scores.psnr[0] > 25.0


# ----------------------------------------------------------------------------------------------- input forms


def test_layouts_and_containers_agree():
    a = smooth_image(32, 48)
    b = perturbed(a, 0.05)
    expected = metrics.score_frames(a, b)
    forms = [
        (a.transpose(2, 0, 1), b.transpose(2, 0, 1), {}),                          # CHW
        (a[None], b[None], {}),                                                    # NHWC
        (torch.from_numpy(a).permute(2, 0, 1)[None], torch.from_numpy(b).permute(2, 0, 1)[None], {}),  # NCHW
        (torch.from_numpy(a), torch.from_numpy(b), {"layout": "HWC"}),
    ]
    for x, y, options in forms:
        got = metrics.score_frames(x, y, **options)
        np.testing.assert_array_equal(got.mse, expected.mse)
        np.testing.assert_allclose(got.ssim, expected.ssim, rtol=0, atol=1e-12)


def test_pil_modes():
    rgb = (smooth_image(24, 24) * 255).round().astype(np.uint8)
    image = Image.fromarray(rgb)
    assert as_frames(image).shape == (1, 24, 24, 3)
    assert as_frames(image.convert("L")).shape == (1, 24, 24, 1)
    assert torch.equal(as_frames(image.convert("RGBA")), as_frames(image))  # opaque alpha is dropped
    translucent = image.convert("RGBA")
    translucent.putalpha(128)
    with pytest.raises(MetricInputError, match="alpha"):
        as_frames(translucent)


@pytest.mark.parametrize("shape", [(3, 20, 3), (1, 30, 1), (2, 3, 16, 3)])
def test_ambiguous_layouts_are_refused(shape):
    with pytest.raises(MetricInputError, match="ambiguous"):
        as_frames(np.zeros(shape, np.float32))


def test_explicit_layout_resolves_ambiguity_and_bad_channels_are_refused():
    assert as_frames(np.zeros((3, 20, 3), np.float32), layout="CHW").shape == (1, 20, 3, 3)
    with pytest.raises(MetricInputError, match="channels"):
        as_frames(np.zeros((16, 16, 4), np.float32), layout="HWC")
    with pytest.raises(MetricInputError, match="layout"):
        as_frames(np.zeros((16, 16), np.float32), layout="XYZ")


# ----------------------------------------------------------------------------------------------- refusals


def test_refusals():
    a = smooth_image(32, 32)
    with pytest.raises(MetricInputError, match="differ in shape"):
        metrics.psnr(a, a[:, :31])
    bad = a.copy()
    bad[3, 4, 1] = np.nan
    with pytest.raises(NonFiniteError) as info:
        metrics.ssim(a, bad)
    assert (info.value.which, info.value.kind) == ("candidate", "NaN")
    bad[3, 4, 1] = np.inf
    with pytest.raises(NonFiniteError, match="baseline contains Inf"):
        metrics.psnr(bad, a)
    with pytest.raises(MetricInputError, match="smaller than the 11x11 SSIM window"):
        metrics.ssim(a[:10, :10], a[:10, :10])
    with pytest.raises(MetricInputError, match="tile grid"):
        metrics.worst_tile_ssim(a[:12, :12], a[:12, :12], grid=4)
    with pytest.raises(MetricInputError, match="value_range"):
        metrics.psnr(a * 255, a * 255)  # a float image in [0, 255] needs value_range=(0, 255)
    with pytest.raises(MetricInputError, match="value_range"):
        metrics.psnr(a.astype(np.int64), a.astype(np.int64))
    with pytest.raises(MetricInputError, match="value_range"):
        metrics.psnr(a * 2 - 1, a * 2 - 1)  # [-1, 1] decoder output
    assert metrics.psnr(a * 2 - 1, a * 2 - 1 + 0.01, value_range=(-1, 1)) == pytest.approx(
        -10 * math.log10(0.005 ** 2), abs=1e-3)


# ----------------------------------------------------------------------------------------------- properties


image_pairs = st.integers(11, 24).flatmap(lambda h: st.integers(11, 24).flatmap(lambda w: st.tuples(
    arrays(np.uint8, (h, w, 3)), arrays(np.uint8, (h, w, 3)))))


@settings(max_examples=30, deadline=None)
@given(image_pairs)
def test_property_ranges_and_symmetry(pair):
    # Arbitrary uint8 data includes flat patches offset by a constant, the worst case for float32 statistics:
    # float64 must match scikit-image tightly there, float32 within its documented 1e-4.
    a, b = pair
    a32, b32 = a.astype(np.float32) / np.float32(255), b.astype(np.float32) / np.float32(255)
    reference = sk_ssim(a32, b32)
    ab, ba = (metrics.score_frames(x, y, precision="float64") for x, y in ((a, b), (b, a)))
    assert ab.psnr[0] >= 0.0  # MSE of [0, 1] data is at most 1
    assert ab.psnr[0] == ba.psnr[0]
    assert -1.0 <= ab.ssim[0] <= 1.0
    assert ab.ssim[0] == pytest.approx(ba.ssim[0], abs=1e-9)
    assert ab.ssim[0] == pytest.approx(reference, abs=1e-9)
    assert metrics.ssim(a, b) == pytest.approx(reference, abs=1e-4)
    same = metrics.score_frames(a, a)
    assert same.psnr[0] == math.inf and same.ssim[0] == 1.0


@settings(max_examples=25, deadline=None)
@given(arrays(np.float64, (3, 5), elements=st.floats(-10, 10)), arrays(np.float64, (3, 5), elements=st.floats(-10, 10)))
def test_property_tensor_metrics(a, b):
    out = metrics.tensor_metrics(a, b)
    assert out["max_abs"] == pytest.approx(np.abs(b - a).max())
    assert out["max_abs"] == metrics.tensor_metrics(b, a)["max_abs"]
    assert -1.0 - 1e-12 <= out["cosine"] <= 1.0 + 1e-12
    assert out["rel_error"] >= 0.0


# ----------------------------------------------------------------------------------------------- tensors


def test_tensor_metrics_match_their_formulas():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((2, 16, 8, 8))
    base = 0.7 * noise + rng.standard_normal(noise.shape)
    cand = base + 0.01 * rng.standard_normal(noise.shape)
    out = metrics.tensor_metrics(torch.from_numpy(base).float(), torch.from_numpy(cand).float(), noise=noise)
    b, c = base.astype(np.float32).astype(np.float64), cand.astype(np.float32).astype(np.float64)
    assert out["max_abs"] == pytest.approx(np.abs(c - b).max(), rel=1e-12)
    assert out["rel_error"] == pytest.approx(np.linalg.norm(c - b) / np.linalg.norm(b), rel=1e-12)
    assert out["cosine"] == pytest.approx(np.sum(b * c) / np.linalg.norm(b) / np.linalg.norm(c), rel=1e-12)
    assert out["disp_rel_error"] == pytest.approx(np.linalg.norm(c - b) / np.linalg.norm(b - noise), rel=1e-6)
    assert metrics.cosine(base, -base) == pytest.approx(-1.0)
    assert metrics.rel_error(np.zeros(4), np.zeros(4)) == 0.0 and metrics.rel_error(np.zeros(4), np.ones(4)) == math.inf
    with pytest.raises(MetricInputError, match="differ in shape"):
        metrics.max_abs(base, cand[:1])
    with pytest.raises(NonFiniteError, match="candidate contains NaN"):
        metrics.max_abs(base, np.full_like(base, np.nan))


# ----------------------------------------------------------------------------------------------- audio


SR = 16000


def tone(seconds=1.0, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(SR * seconds)) / SR
    envelope = 1 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return 0.4 * np.sin(2 * np.pi * 220 * t) * envelope + 0.02 * rng.standard_normal(t.size)


def test_si_sdr_is_scale_invariant_and_identity_is_inf():
    rng = np.random.default_rng(1)
    base = tone()
    cand = base + 0.01 * rng.standard_normal(base.size)
    value = metrics.si_sdr(base, cand)
    assert metrics.si_sdr(base, 0.5 * cand) == pytest.approx(value, abs=1e-9)
    assert metrics.si_sdr(base, base) == math.inf
    assert metrics.si_sdr(base, 3.0 * base) > 250  # a rescaled copy: only float64 rounding is left
    assert metrics.si_sdr(base, np.zeros_like(base)) == -math.inf
    b0, c0 = base - base.mean(), cand - cand.mean()
    target = (np.dot(c0, b0) / np.dot(b0, b0)) * b0
    residual = c0 - target
    assert value == pytest.approx(10 * np.log10(np.sum(target ** 2) / np.sum(residual ** 2)), abs=1e-9)


def test_a_noisier_copy_scores_lower_on_every_audio_metric():
    rng = np.random.default_rng(2)
    base = tone()
    slight = metrics.audio_metrics(base, base + 0.005 * rng.standard_normal(base.size), SR)
    heavy = metrics.audio_metrics(base, base + 0.1 * rng.standard_normal(base.size), SR)
    for key in ("si_sdr", "mel_psnr", "mel_ssim"):
        assert heavy[key] < slight[key]
    same = metrics.audio_metrics(base, base, SR)
    assert same == {"si_sdr": math.inf, "mel_psnr": math.inf, "mel_ssim": 1.0}


def test_audio_layouts_and_pcm():
    base = tone()
    stereo = np.stack([base, base[::-1].copy()])
    noisy = stereo + 0.01 * np.random.default_rng(0).standard_normal(stereo.shape)
    channels_first = metrics.audio_metrics(stereo, noisy, SR)
    assert metrics.audio_metrics(stereo.T, noisy.T, SR) == channels_first
    assert metrics.audio_metrics(stereo[None], noisy[None], SR) == channels_first
    pcm = (base * 32767).round().astype(np.int16)
    assert metrics.si_sdr(pcm, pcm.astype(np.float64) / 32768) == math.inf


def test_mel_filterbank_and_refusals():
    bank = audio.mel_filterbank(SR)
    assert bank.shape == (audio.N_MELS, audio.N_FFT // 2 + 1)
    assert float(bank.min()) >= 0.0 and float(bank.max()) <= 1.0
    assert bool((bank.sum(dim=1) > 0).all())  # no empty band at 16 kHz
    with pytest.raises(MetricInputError, match="mel frames"):
        metrics.mel_ssim(tone(0.25), tone(0.25), SR)  # 4000 samples: 8 frames < 11
    with pytest.raises(MetricInputError, match="sample_rate"):
        metrics.mel_psnr(tone(), tone(), None)
    with pytest.raises(MetricInputError, match="silent"):
        metrics.si_sdr(np.zeros(SR), tone())
    with pytest.raises(MetricInputError, match="channels from samples"):
        metrics.si_sdr(np.zeros((8, 8)), np.zeros((8, 8)))
