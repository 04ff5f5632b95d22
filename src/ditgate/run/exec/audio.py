"""Audio pipelines: how seconds map to latent frames and back, and the WAV file each audio row leaves behind.

An audio VAE turns one latent frame into `hop_length` waveform samples (the product of its downsampling ratios;
`AutoencoderOobleck.hop_length`) at `sampling_rate` samples per second (`vae.config.sampling_rate`). So

    latent frames = ceil(int(seconds * sampling_rate) / hop_length)      (`seconds_to_latent_frames`)
    seconds       = frames * hop_length / sampling_rate                  (`latent_frames_to_seconds`)

`int(seconds * sampling_rate)` is the number of samples a pipeline keeps when it crops the decoded waveform
(StableAudioPipeline crops to `[int(start * sr), int(end * sr))`), and the frame count is the number of latent
frames that cover them. A fixed-window model (Stable Audio) always denoises `transformer.config.sample_size`
frames (`window_seconds` long) whatever duration is asked; a variable-length model denoises about as many as
`seconds_to_latent_frames` says, plus its own padding.
"""

from __future__ import annotations

import io
import math
import wave
from pathlib import Path
from typing import Any

import numpy as np

from ditgate.core.errors import DitgateError

PCM_BITS = 16
_PCM_MAX = 2 ** (PCM_BITS - 1) - 1


class AudioLayoutError(DitgateError):
    """The pipeline does not say how long a latent frame is (no audio VAE with a hop length and a sample rate)."""


def _vae(pipe) -> Any:
    vae = getattr(pipe, "vae", None)
    if vae is None:
        raise AudioLayoutError(f"{type(pipe).__name__} has no `vae`, so latent frames have no length in seconds")
    return vae


RATE_NAMES = ("sampling_rate", "sample_rate", "audio_sample_rate", "sr")


def _rate_on(obj) -> int | None:
    for holder in (getattr(obj, "config", None), obj):
        for name in RATE_NAMES:
            rate = getattr(holder, name, None) if holder is not None else None
            if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0:
                return rate
    return None


def sample_rate(pipe) -> int:
    """Waveform samples per second: found on the audio VAE (`config.sampling_rate`, `config.sample_rate`, ...), else
    on the pipeline itself or its vocoder / feature extractor."""
    holders = [getattr(pipe, "vae", None), getattr(pipe, "vocoder", None), pipe,
               getattr(pipe, "feature_extractor", None)]
    for holder in holders:
        rate = _rate_on(holder) if holder is not None else None
        if rate:
            return rate
    raise AudioLayoutError(f"{type(pipe).__name__} says nowhere how many samples per second its audio has (none "
                           f"of {', '.join(RATE_NAMES)} on its vae, vocoder, feature extractor or itself)")


def hop_length(pipe) -> int:
    """Waveform samples per latent frame: `vae.hop_length`, else the product of `vae.config.downsampling_ratios`."""
    vae = _vae(pipe)
    hop = getattr(vae, "hop_length", None)
    if hop is None:
        ratios = getattr(getattr(vae, "config", None), "downsampling_ratios", None)
        hop = int(np.prod(ratios)) if ratios else None
    if not isinstance(hop, (int, np.integer)) or hop <= 0:
        raise AudioLayoutError(f"{type(vae).__name__} has neither `hop_length` nor `config.downsampling_ratios`")
    return int(hop)


def seconds_to_latent_frames(pipe, seconds: float) -> int:
    """Latent frames that cover `seconds` of audio (see the module docstring)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
    samples = int(seconds * sample_rate(pipe))
    return -(-samples // hop_length(pipe))


def latent_frames_to_seconds(pipe, frames: int) -> float:
    """Seconds of audio that `frames` latent frames decode to."""
    if not isinstance(frames, (int, np.integer)) or frames < 0:
        raise ValueError(f"frames must be an integer >= 0, got {frames!r}")
    return int(frames) * hop_length(pipe) / sample_rate(pipe)


def window_seconds(pipe) -> float | None:
    """Length of a fixed-window model's window (`transformer.config.sample_size` frames); None without one."""
    frames = getattr(getattr(getattr(pipe, "transformer", None), "config", None), "sample_size", None)
    return latent_frames_to_seconds(pipe, frames) if isinstance(frames, int) else None


def wav_bytes(waveform: np.ndarray, rate: int) -> bytes:
    """A 16-bit PCM WAV file of `waveform` (channels, samples), float in [-1, 1]; values outside are clipped."""
    wave_array = np.asarray(waveform, dtype=np.float64)
    if wave_array.ndim == 1:
        wave_array = wave_array[None]
    if wave_array.ndim != 2 or wave_array.shape[0] > wave_array.shape[1]:
        raise ValueError(f"a waveform is (channels, samples) with fewer channels than samples, got "
                         f"{wave_array.shape}")
    if not np.isfinite(wave_array).all():
        raise ValueError("the waveform holds NaN or Inf; no WAV file is written for it")
    pcm = np.round(np.clip(wave_array, -1.0, 1.0) * _PCM_MAX).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(pcm.shape[0])
        out.setsampwidth(PCM_BITS // 8)
        out.setframerate(int(rate))
        out.writeframes(pcm.T.tobytes())  # interleaved: sample 0 of every channel, then sample 1, ...
    return buffer.getvalue()


def write_wav(path: str | Path, waveform: np.ndarray, rate: int) -> Path:
    """Write `waveform` (channels, samples) as a 16-bit PCM WAV file, whole or not at all."""
    from ditgate.run.exec.files import write_bytes

    path = Path(path)
    write_bytes(path, wav_bytes(waveform, rate))
    return path
