"""`ditgate gate --phase PHASE BASE CAND`: check one output against its baseline with the phase's gate.

BASE and CAND are files or folders of the same kind:
- an image (.png, .jpg, .jpeg, .webp, .bmp, .tif, .tiff)                        -> image
- a folder of frames (sorted by name; both folders must hold the same names)    -> video
- a video file (.mp4, .webm, .mov, .avi, .mkv, .gif), decoded with imageio      -> video
- a .npy array (F, H, W, C) with C = 1 or 3                                     -> video
- a .npy array (H, W, C) with C = 1 or 3                                        -> image
- any other .npy array, or a tensor saved with torch.save (.pt, .pth)           -> latent
- a .wav file (PCM, read with the standard library)                             -> audio
- a row folder of `ditgate run` (RUN/rows/NAME: output.npy, result.json)        -> the row's modality; its
  latents.npy (both rows) add the latent checks, the baseline row's noise.npy is the initial noise, and the run's
  dtype (RUN/run.json) is the default --dtype
Exit status: 0 when the gate passes, 1 when it fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import wave
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError, GateInputError

HELP = "check a candidate output against its baseline with a phase's gate (checklists/gates.json)"

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".webm", ".mov", ".avi", ".mkv", ".gif"}
TENSOR_SUFFIXES = {".npy", ".pt", ".pth"}
ROW_OUTPUT, ROW_RESULT = "output.npy", "result.json"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phase", required=True, help="phase whose gate applies (cache, cp, tp, tep, vaep, ...)")
    parser.add_argument("base", metavar="BASE", help="baseline output: image, video, frame folder, run row folder, "
                                                     ".npy, .pt or .wav")
    parser.add_argument("cand", metavar="CAND", help="candidate output of the same kind")
    parser.add_argument("--modality", choices=("image", "video", "audio", "latent"),
                        help="override the modality inferred from the inputs")
    parser.add_argument("--latents", nargs=2, metavar=("BASE_LAT", "CAND_LAT"),
                        help="final latents (.npy/.pt) of baseline and candidate: adds the phase's latent checks")
    parser.add_argument("--noise", metavar="FILE", help="initial noise latents (.npy/.pt), for disp_rel_error")
    parser.add_argument("--dtype", help="dtype the phase ran in (default: the run's, else float32)")
    parser.add_argument("--sample-rate", type=int, help="sample rate of audio given as arrays (a .wav has its own)")
    parser.add_argument("--value-range", type=float, nargs=2, metavar=("LOW", "HIGH"),
                        help="the range image or video arrays (.npy/.pt) hold, when not [0, 1] (floats) or their "
                             "integer type's, e.g. 0 255 or -1 1")
    parser.add_argument("--floor", action="append", default=[], metavar="METRIC=VALUE",
                        help="threshold from the calibrated noise floor (needed for exact phases in bf16/fp16), e.g. "
                             "mel_psnr=23.5 (repeatable)")
    parser.add_argument("--gates", metavar="FILE", help="gate table to use instead of checklists/gates.json")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


# ------------------------------------------------------------------------------------------------- reading


def _read_image(path: Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, UnidentifiedImageError) as exc:
        raise GateInputError(f"cannot read image {path}: {exc}") from exc


def _read_video(path: Path) -> Any:
    import imageio.v3 as iio

    try:
        return iio.imread(path, index=None)
    except Exception as exc:  # imageio raises plugin-specific errors; all mean "cannot decode this file here"
        raise GateInputError(
            f"cannot decode {path} ({exc}); install a video backend for imageio (`pip install imageio-ffmpeg` or "
            "`av`), or pass folders of frames or .npy arrays (F, H, W, C) instead") from exc


def _read_tensor(path: Path, header_only: bool = False) -> Any:
    try:
        if path.suffix.lower() == ".npy":
            import numpy as np

            value = np.load(path, allow_pickle=False, mmap_mode="r" if header_only else None)
        else:
            import torch

            value = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise GateInputError(f"cannot read {path}: it holds Python objects besides tensors, and unpickling them could "
                             "run code; save plain tensors (torch.save(tensor) or numpy.save)") from None
    except Exception as exc:  # noqa: BLE001 - truncated zips, bad headers, object arrays: all unreadable input
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GateInputError(f"cannot read {path} as a tensor ({type(exc).__name__}: {first[:200]})") from None
    if not hasattr(value, "shape"):
        raise GateInputError(f"{path} holds a {type(value).__name__}, not a tensor")
    kind = getattr(getattr(value, "dtype", None), "kind", "f")  # NumPy's; torch tensors hold numbers
    if kind not in "biufc":
        raise GateInputError(f"{path} holds {value.dtype} values (text or records), not numbers: nothing to compare")
    if len(value.shape) == 0:
        raise GateInputError(f"{path} holds a single number (a 0-d array), not an output")
    if 0 in tuple(value.shape):
        raise GateInputError(f"{path} holds an empty array (shape {tuple(value.shape)}): nothing to compare")
    return value


def _read_wav(path: Path) -> tuple[Any, int]:
    import numpy as np

    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (OSError, wave.Error, EOFError) as exc:
        raise GateInputError(f"cannot read WAV file {path}: {exc}") from exc
    if width == 3:  # 24-bit PCM: place in the top bytes of an int32
        bytes3 = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        samples = (bytes3[:, 0] << 8) | (bytes3[:, 1] << 16) | (bytes3[:, 2] << 24)
    else:
        dtypes = {1: np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}
        if width not in dtypes:
            raise GateInputError(f"{path}: unsupported sample width of {width} bytes")
        samples = np.frombuffer(raw, dtype=dtypes[width])
    return samples.reshape(-1, channels).T.copy(), rate


def _frame_names(folder: Path) -> list[str]:
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not names:
        raise GateInputError(f"{folder} holds no image frames ({', '.join(sorted(IMAGE_SUFFIXES))}) and is not a "
                             f"row folder of `ditgate run` ({ROW_OUTPUT})")
    return names


def _is_row(path: Path) -> bool:
    return path.is_dir() and (path / ROW_OUTPUT).is_file()


def _row_result(path: Path) -> dict:
    try:
        return json.loads((path / ROW_RESULT).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def infer_modality(path: Path) -> str:
    """The modality a file or folder holds (see the module docstring)."""
    if not path.exists():
        raise GateInputError(f"no such file or folder: {path}")
    if _is_row(path):
        modality = _row_result(path).get("modality")
        return modality if modality in ("image", "video", "audio") else infer_modality(path / ROW_OUTPUT)
    if path.is_dir():
        return "video"
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in VIDEO_SUFFIXES:
        return "video"
    if suffix == ".wav":
        return "audio"
    if suffix in TENSOR_SUFFIXES:
        shape = tuple(_read_tensor(path, header_only=True).shape)
        if len(shape) in (3, 4) and shape[-1] in (1, 3):
            return "video" if len(shape) == 4 else "image"
        return "latent"
    raise GateInputError(f"{path}: unknown kind of file (expected an image, a video, a frame folder, a run row "
                         "folder, .npy, .pt or .wav)")


def _read_one(path: Path, modality: str) -> tuple[Any, int | None]:
    """(data, sample rate or None) of one input."""
    if _is_row(path):
        return _read_tensor(path / ROW_OUTPUT), _row_result(path).get("sample_rate")
    suffix = path.suffix.lower()
    if modality == "audio" and suffix == ".wav":
        return _read_wav(path)
    if suffix in IMAGE_SUFFIXES:
        return _read_image(path), None
    if suffix in VIDEO_SUFFIXES:
        return _read_video(path), None
    return _read_tensor(path), None


def read_pair(base: Path, cand: Path, modality: str) -> tuple[Any, Any, int | None]:
    """(baseline, candidate, sample rate or None) read as `modality`."""
    frames = [p.is_dir() and not _is_row(p) for p in (base, cand)]
    if any(frames):
        if not all(frames):
            raise GateInputError("BASE and CAND must both be frame folders, or neither")
        names_b, names_c = _frame_names(base), _frame_names(cand)
        if names_b != names_c:
            only_b, only_c = sorted(set(names_b) - set(names_c)), sorted(set(names_c) - set(names_b))
            raise GateInputError(f"frame folders hold different frames: only in BASE {only_b[:5]}, "
                                 f"only in CAND {only_c[:5]}")
        return [_read_image(base / n) for n in names_b], [_read_image(cand / n) for n in names_c], None
    (b, rate_b), (c, rate_c) = _read_one(base, modality), _read_one(cand, modality)
    if rate_b and rate_c and rate_b != rate_c:
        raise GateInputError(f"sample rates differ: {base} {rate_b} Hz, {cand} {rate_c} Hz")
    return b, c, rate_b or rate_c


def _row_extras(base: Path, cand: Path) -> dict[str, Any]:
    """Latents, noise and dtype that `ditgate run` stored next to two row outputs."""
    extras: dict[str, Any] = {}
    if not (_is_row(base) and _is_row(cand)):
        return extras
    if (base / "latents.npy").is_file() and (cand / "latents.npy").is_file():
        extras["latents"] = (_read_tensor(base / "latents.npy"), _read_tensor(cand / "latents.npy"))
    if (base / "noise.npy").is_file():
        extras["noise"] = _read_tensor(base / "noise.npy")
    try:
        extras["dtype"] = json.loads((base.parent.parent / "run.json").read_text())["dtype"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return extras


def _read_as(path: Path, kind: str) -> str:
    """`kind`, and for an array why: its shape (a channels-first image reads as a latent)."""
    if path.suffix.lower() not in TENSOR_SUFFIXES or _is_row(path):
        return kind
    shape = tuple(_read_tensor(path, header_only=True).shape)
    why = f"{kind} (a {shape} array"
    if len(shape) in (3, 4) and shape[-3] in (1, 3) and kind == "latent":
        why += "; images and videos are read from (H, W, C) or (F, H, W, C) arrays with C 1 or 3, so a channels-first "
        why += "one is read as a latent unless --modality says otherwise"
    return why + ")"


def _rescaled(x: Any, value_range: list[float], modality: str) -> Any:
    """An image or video array holding values in `value_range`, mapped onto [0, 1]."""
    import numpy as np

    low, high = value_range
    if modality not in ("image", "video") or not hasattr(x, "shape"):
        raise GateInputError("--value-range applies to image and video arrays (.npy, .pt); image files, frame "
                             "folders and videos carry their own range")
    if not high > low:
        raise GateInputError(f"--value-range {low:g} {high:g}: HIGH must be above LOW")
    return ((np.asarray(x, dtype=np.float64) - low) / (high - low)).astype(np.float32)


# what the library's messages name by keyword argument, said as this command's options
_CLI_WORDS = ((re.compile(r"pass (the range the data really has, e\.g\. )?value_range=.*$"),
               "pass --value-range LOW HIGH, the range the arrays hold (e.g. --value-range 0 255 for a float image "
               "in [0, 255], or -1 1 for a raw decoder output)"),
              (re.compile(r"pass layout=.*$"), "save the arrays channels last, (H, W, C) or (F, H, W, C) with C 1 or "
               "3, or as image files"),
              (re.compile(r"\(sample_rate=\.\.\.\)"), "(--sample-rate HZ; a .wav file carries its own)"),
              (re.compile(r"\(noise=\.\.\.\)"), "(--noise FILE, or row folders of `ditgate run`)"),
              (re.compile(r"^floor= "), "--floor "),
              (re.compile(r"not latents="), "not --latents"))


def _in_cli_words(message: str) -> str:
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message


def _floor_missing(phase: str, modality: str, dtype: str, floor: dict | None, table: dict | None) -> str | None:
    """Why an exact phase in reduced precision cannot be gated here without its calibrated floor (None: it can)."""
    from ditgate.gates.calibration import reduced_precision
    from ditgate.gates.verdicts import load_gates

    table = table or load_gates()
    if floor or modality == "latent" or not table["phases"][phase]["exact"] or not reduced_precision(dtype, table):
        return None
    return (f"{phase} is exact, and in {dtype} it is judged against the calibrated floor of its run, which this "
            "command was not given: pass --floor METRIC=VALUE with the thresholds `ditgate run` derived (the "
            "report's floor table), or gate the whole run with `ditgate run ... --resume`")


def _parse_floor(items: list[str]) -> dict[str, float] | None:
    floor = {}
    for item in items:
        metric, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError(item)
            floor[metric.strip()] = float(value)
        except ValueError:
            raise GateInputError(f"--floor takes METRIC=VALUE, got {item!r}") from None
    return floor or None


# ------------------------------------------------------------------------------------------------- output


def _table(verdict: Any) -> str:
    from ditgate.gates.verdicts import format_value

    rows = [("metric", "value", "threshold", "result")]
    checked = set()
    for check in verdict.checks:
        checked.add(check.metric)
        value = ("n/a" if check.value is None else f"{check.value:g}") if check.metric == "garbled" else \
            format_value(check.metric, check.value)
        threshold = f"{check.op} " + (f"{check.threshold:g}" if check.metric == "garbled" else
                                      format_value(check.metric, check.threshold, threshold=True))
        rows.append((check.metric, value, threshold, "pass" if check.passed else "FAIL"))
    rows += [(name, format_value(name, value), "-", "-")
             for name, value in verdict.metrics.items() if name not in checked]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from ditgate import gates

    base, cand = Path(args.base), Path(args.cand)
    for path in (base, cand):
        if not path.exists():
            raise GateInputError(f"no such file or folder: {path}")
    modality = args.modality
    if modality is None:
        kinds = infer_modality(base), infer_modality(cand)
        if kinds[0] != kinds[1]:
            raise GateInputError(f"BASE is read as {_read_as(base, kinds[0])} and CAND as {_read_as(cand, kinds[1])}; "
                                 "pass --modality to say what both are")
        modality = kinds[0]
    baseline, candidate, sample_rate = read_pair(base, cand, modality)
    if args.value_range:
        baseline, candidate = (_rescaled(x, args.value_range, modality) for x in (baseline, candidate))
    extras = _row_extras(base, cand)
    if args.latents:
        extras["latents"] = tuple(_read_tensor(Path(p)) for p in args.latents)
    if args.noise:
        extras["noise"] = _read_tensor(Path(args.noise))
    if modality == "latent":
        extras.pop("latents", None)
    table = gates.load_gates(args.gates) if args.gates else None
    dtype = args.dtype or extras.get("dtype", "float32")
    floor = _parse_floor(args.floor)
    try:
        verdict = gates.evaluate(args.phase, modality, baseline, candidate, latents=extras.get("latents"),
                                 noise=extras.get("noise"), dtype=dtype, sample_rate=args.sample_rate or sample_rate,
                                 floor=floor, gates=table)
    except DitgateError as exc:  # the library's words name its keyword arguments: say the options instead
        raise type(exc)(_in_cli_words(str(exc))) from None
    missing = _floor_missing(args.phase, modality, dtype, floor, table)
    if missing:  # the gate it would apply is the loose default: a check that cannot run never passes
        verdict.passed = False
        verdict.reasons.append(missing)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print(f"ditgate gate: phase {verdict.phase}, {verdict.modality}: {base} vs {cand}")
        print(_table(verdict))
        print("PASS" if verdict.passed else "FAIL")
        for reason in verdict.reasons:
            print(f"  - {reason}")
    return 0 if verdict.passed else 1
