"""The run folder: one sub-folder per row holding its outputs and `result.json`.

    RUN/run.json                      model, request, dtype, device, versions, rows
    RUN/rows/NAME/output.npy          decoded output (image HWC, video FHWC, audio CS), float32
    RUN/rows/NAME/latents.npy         final latents (after the last step), when the pipeline exposes them
    RUN/rows/NAME/noise.npy           initial noise (the first transformer input, one copy of a batched-CFG input)
    RUN/rows/NAME/first_step.npy      the transformer's output at its first call (the first-step check)
    RUN/rows/NAME/output.png          image rows: the image as 8-bit RGB (to look at)
    RUN/rows/NAME/output.mp4          video rows: the frames at VIDEO_FPS (output.gif where no MP4 encoder is installed)
    RUN/rows/NAME/output.wav          audio rows: the waveform as 16-bit PCM at the VAE's sample rate (to listen to)
    RUN/rows/NAME/output_NAME.npy     each further output of the call (`audio` beside the frames), its first sample
    RUN/rows/NAME/output_NAME.wav     a further audio output as 16-bit PCM (to listen to)
    RUN/rows/NAME/result.json         written last: its presence means the row finished
    RUN/report.json, report.md, grid.png

Every file is written to a temporary name and renamed, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

RESULT = "result.json"


def _usual_mode(fd: int) -> None:
    """mkstemp makes a file only its owner can read; give it the mode a plain open() would (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` with the file it was writing: a full disk says which file could not be written."""
    return exc if exc.filename else OSError(exc.errno, exc.strerror or str(exc), str(path))


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        _usual_mode(fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in JSON")


def write_array(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npy", dir=path.parent)
    try:
        _usual_mode(fd)
        with os.fdopen(fd, "wb") as handle:
            np.save(_Writer(handle), array)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _Writer:
    """A file NumPy writes through Python's `write` (in chunks): a full disk then raises OSError(ENOSPC), where
    NumPy's own C-level write of a real file says only "N requested and M written"."""

    def __init__(self, handle):
        self.write = handle.write


def row_dir(run_dir: Path, name: str) -> Path:
    return run_dir / "rows" / name


def save_row(run_dir: Path, name: str, result: dict[str, Any], arrays: dict[str, np.ndarray | None],
             files: dict[str, bytes] | None = None) -> None:
    """Arrays and other files (name -> content) first, `result.json` last."""
    folder = row_dir(run_dir, name)
    (folder / RESULT).unlink(missing_ok=True)
    for key, array in arrays.items():
        if array is not None:
            write_array(folder / f"{key}.npy", array)
    for file_name, data in (files or {}).items():
        write_bytes(folder / file_name, data)
    write_json(folder / RESULT, result)


def discard_result(run_dir: Path, name: str) -> None:
    """Forget a row's stored result before the row runs again: a worker group's poll must never read the result
    of an earlier run (`--resume` of a row that changed, hung or failed) as this run's."""
    (row_dir(run_dir, name) / RESULT).unlink(missing_ok=True)


def load_result(run_dir: Path, name: str) -> dict[str, Any] | None:
    path = row_dir(run_dir, name) / RESULT
    return json.loads(path.read_text()) if path.is_file() else None


def outputs_readable(run_dir: Path, name: str) -> bool:
    """Whether the row's output.npy exists and every stored array's header and size can be read (a resumed row
    whose outputs went missing or were cut short runs again)."""
    folder = row_dir(run_dir, name)
    arrays = sorted(folder.glob("*.npy"))
    if not (folder / "output.npy").is_file():
        return False
    try:
        for path in arrays:
            np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return False
    return True


def load_array(run_dir: Path, name: str, key: str) -> np.ndarray | None:
    path = row_dir(run_dir, name) / f"{key}.npy"
    return np.load(path) if path.is_file() else None


VIDEO_FPS = 8  # the frame rate of a row's video file (a tiny model's few frames stay visible)


def to_uint8(array: np.ndarray) -> np.ndarray:
    """An output in [0, 1] as 8-bit values, rounded (what output.png holds)."""
    return np.round(np.clip(np.nan_to_num(np.asarray(array, dtype=np.float64)), 0.0, 1.0) * 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """An image (HWC or HW, float in [0, 1]) as a PNG file."""
    import io

    from PIL import Image

    pixels = to_uint8(image)
    if pixels.ndim == 3 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def video_bytes(frames: np.ndarray, fps: int = VIDEO_FPS) -> tuple[str, bytes]:
    """A video (FHWC, float in [0, 1]) as (file name, content): an MP4 through diffusers' `export_to_video` where
    imageio finds an ffmpeg, else a GIF through `export_to_gif`."""
    import tempfile

    from diffusers.utils import export_to_gif, export_to_video
    from PIL import Image

    pixels = to_uint8(frames)
    with tempfile.TemporaryDirectory(prefix="ditgate-video-") as folder:
        try:
            import imageio

            imageio.plugins.ffmpeg.get_exe()
            path = Path(folder) / "output.mp4"
            # H.264 in yuv420p needs even sides: an odd side gets its last row or column repeated, nothing resized
            even = np.pad(pixels, [(0, 0), (0, pixels.shape[1] % 2), (0, pixels.shape[2] % 2), (0, 0)], mode="edge")
            # frames in [0, 1] (export_to_video scales by 255), no resizing to macro blocks
            export_to_video([p.astype(np.float32) / 255 for p in even], str(path), fps=fps, macro_block_size=1)
            if path.stat().st_size == 0:
                raise RuntimeError("the encoder wrote nothing")
        except (ImportError, AttributeError, RuntimeError, OSError):
            path = Path(folder) / "output.gif"
            export_to_gif([Image.fromarray(p) for p in pixels], str(path), fps=fps)
        return path.name, path.read_bytes()


def viewable(output: np.ndarray, modality: str) -> dict[str, bytes]:
    """The file a person opens for a row's output: output.png for an image, output.mp4 (or .gif) for a video; {}
    for other modalities (audio's WAV needs its sample rate: ditgate.run.exec.audio) or an output with NaN/Inf."""
    if output is None or not np.isfinite(output).all():
        return {}
    array = np.asarray(output)
    while array.ndim > {"image": 3, "video": 4}.get(modality, array.ndim) and array.shape[0] == 1:
        array = array[0]  # a batch of one
    try:
        if modality == "image" and array.ndim in (2, 3):
            return {"output.png": png_bytes(array)}
        if modality == "video" and array.ndim == 4:
            name, data = video_bytes(array)
            return {name: data}
    except (ValueError, TypeError, OSError):  # a layout PIL or the encoder cannot take: the .npy is the output
        return {}
    return {}
