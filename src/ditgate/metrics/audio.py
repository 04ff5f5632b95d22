"""Audio metrics: SI-SDR on the waveform and PSNR/SSIM of the log-mel spectrogram.

Waveforms are (T,), (C, T), (T, C) (the channel axis is the short one, at most 16) or (B, C, T) (batch items
become channels). int16/int32/uint8 PCM is scaled to [-1, 1]; floats are taken as they are.

SI-SDR (scale-invariant signal-to-distortion ratio, Le Roux et al. 2019), in dB, float64, per channel after
removing each channel's mean, then averaged over channels:
    target = (<cand, base> / ||base||^2) base,   SI-SDR = 10 log10(||target||^2 / ||cand - target||^2)
It is inf for a candidate equal to the baseline up to scale, and -inf for a silent candidate.

Mel spectrogram (settings below, fixed so that numbers are comparable across runs and with the noise floor):
- STFT: n_fft 2048, hop 512, periodic Hann window of 2048, centred frames with reflection padding;
- power spectrum |X|^2 -> 128 triangular mel filters (HTK mel scale, 0 Hz to sample_rate / 2, peak 1, no area
  normalisation), built here with torch (torchaudio is not required);
- log scale: dB = 10 log10(max(power, 1e-10));
- data range: both spectrograms are mapped with the *baseline's* peak P: v = (dB - (P - 80)) / 80, clipped to
  [0, 1], i.e. an 80 dB window below the baseline's loudest bin, data range 1.
mel_psnr and mel_ssim are the image PSNR and Gaussian SSIM (kernel.py) of those [0, 1] spectrograms, each channel a
single-channel image of 128 x frames; at least 11 frames (5120 samples) are needed for the SSIM window.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from ditgate.core.errors import MetricInputError
from ditgate.metrics.convert import check_finite, raw_tensor, require_same_shape
from ditgate.metrics.image import FrameScores
from ditgate.metrics.kernel import WINDOW, frame_sums

N_FFT = 2048
HOP = 512
N_MELS = 128
TOP_DB = 80.0
POWER_FLOOR = 1e-10
MAX_CHANNELS = 16

_PCM_SCALE = {torch.int16: 32768.0, torch.int32: 2147483648.0}


def as_waveform(x: Any, name: str = "waveform") -> torch.Tensor:
    """A waveform as float64 (channels, samples) on its own device."""
    t = raw_tensor(x, name)
    if t.dtype in _PCM_SCALE:
        t = t.to(torch.float64) / _PCM_SCALE[t.dtype]
    elif t.dtype == torch.uint8:
        t = (t.to(torch.float64) - 128.0) / 128.0
    elif t.is_floating_point():
        check_finite(t, name)
        t = t.to(torch.float64)
    else:
        raise MetricInputError(f"{name}: dtype {t.dtype} is not a waveform (float, int16, int32 or uint8 PCM)")
    if t.ndim == 1:
        return t.unsqueeze(0)
    if t.ndim == 3:
        return t.reshape(-1, t.shape[-1])
    if t.ndim != 2:
        raise MetricInputError(f"{name}: shape {tuple(t.shape)} is not a waveform (T), (C, T), (T, C) or (B, C, T)")
    rows, cols = t.shape
    if rows <= MAX_CHANNELS < cols:
        return t
    if cols <= MAX_CHANNELS < rows:
        return t.t()
    raise MetricInputError(f"{name}: cannot tell channels from samples in shape {tuple(t.shape)}")


def _pair(baseline: Any, candidate: Any) -> tuple[torch.Tensor, torch.Tensor]:
    base = as_waveform(baseline, "baseline")
    cand = as_waveform(candidate, "candidate").to(base.device)
    require_same_shape(base, cand)
    return base, cand


def _si_sdr(base: torch.Tensor, cand: torch.Tensor) -> float:
    base = base - base.mean(dim=-1, keepdim=True)
    cand = cand - cand.mean(dim=-1, keepdim=True)
    energy = (base * base).sum(dim=-1)
    if bool((energy == 0).any()):
        raise MetricInputError("baseline has a silent channel; SI-SDR is undefined against silence")
    target = ((cand * base).sum(dim=-1) / energy).unsqueeze(-1) * base
    residual = cand - target
    values = []
    for t_energy, r_energy in zip((target * target).sum(-1).tolist(), (residual * residual).sum(-1).tolist()):
        if r_energy == 0:
            values.append(math.inf if t_energy > 0 else -math.inf)
        elif t_energy == 0:
            values.append(-math.inf)
        else:
            values.append(10.0 * math.log10(t_energy / r_energy))
    return float(np.mean(values))


def si_sdr(baseline: Any, candidate: Any) -> float:
    """SI-SDR of `candidate` against `baseline` in dB (see the module docstring)."""
    return _si_sdr(*_pair(baseline, candidate))


def _hz_to_mel(f: torch.Tensor) -> torch.Tensor:
    return 2595.0 * torch.log10(1.0 + f / 700.0)


def _mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def mel_filterbank(sample_rate: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(N_MELS, N_FFT // 2 + 1) triangular filters on the HTK mel scale from 0 Hz to sample_rate / 2."""
    freqs = torch.linspace(0, sample_rate / 2, N_FFT // 2 + 1, dtype=torch.float64)
    edges = _mel_to_hz(torch.linspace(0.0, float(_hz_to_mel(torch.tensor(sample_rate / 2.0))), N_MELS + 2,
                                      dtype=torch.float64))
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - low) / (centre - low)
    falling = (high - freqs) / (high - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).to(device)


def mel_db(wave: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """Log-mel power spectrogram in dB, (channels, N_MELS, frames), float64."""
    if wave.shape[-1] <= N_FFT // 2:
        raise MetricInputError(f"audio of {wave.shape[-1]} samples is too short for an STFT of {N_FFT}")
    window = torch.hann_window(N_FFT, periodic=True, dtype=wave.dtype, device=wave.device)
    spec = torch.stft(wave, N_FFT, hop_length=HOP, window=window, center=True, pad_mode="reflect",
                      return_complex=True)
    power = spec.real ** 2 + spec.imag ** 2
    mel = mel_filterbank(sample_rate, wave.device) @ power
    return 10.0 * torch.log10(torch.clamp(mel, min=POWER_FLOOR))


def _mel_scores(base: torch.Tensor, cand: torch.Tensor, sample_rate: int) -> FrameScores:
    if not isinstance(sample_rate, numbers.Integral) or sample_rate <= 0:
        raise MetricInputError(f"a positive integer sample_rate is needed for mel metrics, got {sample_rate!r}")
    ref, test = mel_db(base, int(sample_rate)), mel_db(cand, int(sample_rate))
    if ref.shape[-1] < WINDOW:
        raise MetricInputError(
            f"audio of {base.shape[-1]} samples gives {ref.shape[-1]} mel frames; SSIM needs at least {WINDOW} "
            f"({(WINDOW - 1) * HOP} samples)")
    floor = ref.amax() - TOP_DB
    to_unit = lambda db: ((db - floor) / TOP_DB).clamp_(0.0, 1.0).to(torch.float32).unsqueeze(-1)  # noqa: E731
    return FrameScores.from_sums(frame_sums(to_unit(ref), to_unit(test), 1), ref.shape[1] * ref.shape[2])


def mel_psnr(baseline: Any, candidate: Any, sample_rate: int) -> float:
    """PSNR in dB of the [0, 1] log-mel spectrograms (all channels together)."""
    return _mel_scores(*_pair(baseline, candidate), sample_rate).clip_psnr


def mel_ssim(baseline: Any, candidate: Any, sample_rate: int) -> float:
    """Gaussian SSIM of the [0, 1] log-mel spectrograms, averaged over channels."""
    return float(_mel_scores(*_pair(baseline, candidate), sample_rate).ssim.mean())


def audio_metrics(baseline: Any, candidate: Any, sample_rate: int) -> dict[str, float]:
    """si_sdr, mel_psnr and mel_ssim."""
    base, cand = _pair(baseline, candidate)
    mel = _mel_scores(base, cand, sample_rate)
    return {"si_sdr": _si_sdr(base, cand), "mel_psnr": mel.clip_psnr, "mel_ssim": float(mel.ssim.mean())}
