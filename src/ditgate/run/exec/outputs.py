"""What a pipeline call returned, as one float32 array and its modality, whatever form the pipeline chose.

Pipelines return a diffusers output object (`images`, `frames`, `audios`, `videos`, `audio`, `waveform`, ...),
a tuple whose first element is the output, a NumPy array, a torch tensor, a list of PIL images (or of frames, for
a video), or a list of arrays. The first sample of the batch is the row's output, laid out as the metrics expect it:
an image [H, W, C], a video [F, H, W, C] and audio [channels, samples], values in [0, 1] for pictures; the batch's
other samples (a batch of prompts) are further outputs, each gated against the baseline's same sample.

A call may return more than one output (frames and audio): `decoded` keeps the first the output object names, and
`further` every other one, each with its modality, so that each is saved and gated with its own modality's gate; an
array output of a name no gate knows (a tensor field beside them) is listed as one that cannot be judged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ditgate.core.errors import DitgateError

# attribute -> modality, in the order they are looked for on an output object
FIELDS = (("frames", "video"), ("videos", "video"), ("video", "video"), ("audios", "audio"), ("audio", "audio"),
          ("waveform", "audio"), ("waveforms", "audio"), ("images", "image"), ("image", "image"))


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.")


def _array(value: Any) -> np.ndarray:
    """A tensor, array, PIL image or (nested) list of them as one float32 array; PIL images scaled to [0, 1]."""
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy()
    if _is_pil(value):
        return np.asarray(value.convert("RGB"), dtype=np.float32) / 255.0
    if isinstance(value, (list, tuple)):
        if not value:
            raise DitgateError("pipeline output is an empty list")
        return np.stack([_array(v) for v in value])
    return np.asarray(value, dtype=np.float32)


def _channels_last(array: np.ndarray) -> np.ndarray:
    """[..., C, H, W] with C in (1, 3, 4) and a wider last axis becomes [..., H, W, C]."""
    if array.ndim >= 3 and array.shape[-3] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        return np.moveaxis(array, -3, -1)
    return array


def _by_shape(array: np.ndarray) -> str:
    """The modality of a bare array, by its layout (batch first)."""
    if array.ndim == 5:
        return "video"
    if array.ndim == 4:
        return "image"
    if array.ndim in (2, 3) and array.shape[-1] > 8 * max(array.shape[-2], 1):
        return "audio"  # [batch, channels, samples] or [channels, samples]: far more samples than channels
    raise DitgateError(f"pipeline output is an array of shape {list(array.shape)}, which is neither an image "
                       "[B, H, W, C], a video [B, F, H, W, C] nor a waveform [B, channels, samples]")


def _first(array: np.ndarray, modality: str, index: int = 0) -> np.ndarray:
    """Sample `index` (the first by default) of a batch in the metrics' layout."""
    if modality == "audio":
        return array[index] if array.ndim == 3 else array
    if modality == "video":
        if array.ndim == 4:  # [F, H, W, C] without a batch axis (a list of frames)
            array = array[None]
        video = array[index]
        if video.shape[-1] not in (1, 3, 4) and video.shape[0] in (1, 3, 4):  # [C, F, H, W]
            video = np.moveaxis(video, 0, -1)
        return _channels_last(video)
    image = array[index] if array.ndim == 4 else array
    return _channels_last(image)


def _batch(array: np.ndarray, modality: str) -> int:
    """How many samples a batch holds (1 for an array without a batch axis)."""
    batched = {"audio": 3, "video": 5, "image": 4}[modality]
    return int(array.shape[0]) if array.ndim == batched else 1


def _items(name: str, array: np.ndarray, modality: str) -> dict[str, dict[str, Any]]:
    """Every sample after the first, as further outputs `NAME_item2`, ... (a batch of prompts: each one gated)."""
    count = _batch(array, modality)
    return {f"{name}_item{i + 1}": {"output": np.ascontiguousarray(_first(array, modality, i), dtype=np.float32),
                                    "modality": modality, "item": i + 1, "of": count} for i in range(1, count)}


def _payload(out: Any) -> tuple[Any, str | None]:
    """The output's data and the modality its name says (None: decide by shape)."""
    if isinstance(out, tuple) and out:
        return _payload(out[0])
    plain = isinstance(out, (np.ndarray, torch.Tensor, list))
    for attr, modality in FIELDS:
        value = out.get(attr) if isinstance(out, dict) else None if plain else getattr(out, attr, None)
        if value is not None:
            return value, modality
    if isinstance(out, (np.ndarray, torch.Tensor)) or _is_pil(out):
        return out, None
    if isinstance(out, list) and out:
        if all(_is_pil(v) for v in out):
            return out, "image"
        if all(isinstance(v, list) for v in out):
            return out, "video"  # one list of frames per prompt
        return out, None
    names = [n for n in dir(out) if not n.startswith("_")][:12]
    raise DitgateError(f"pipeline output {type(out).__name__} holds no images, frames, audio, array or tensor "
                       f"(it has: {', '.join(names) or 'nothing'})")


def _whole(out: Any) -> tuple[np.ndarray, str]:
    """The first output's whole batch as one array, and its modality."""
    value, modality = _payload(out)
    array = _array(value)
    if _is_pil(value):
        array = array[None]
    modality = modality or _by_shape(array)
    if modality == "image" and array.ndim == 5 and array.shape[1] == 1:
        array = array[:, 0]  # one frame per prompt
    return array, modality


def decoded(out: Any) -> tuple[np.ndarray, str]:
    """(the first sample as float32, its modality) of a pipeline's return value; the batch's other samples are
    further outputs (`further`)."""
    array, modality = _whole(out)
    return np.ascontiguousarray(_first(array, modality), dtype=np.float32), modality


def further(out: Any) -> dict[str, dict[str, Any]]:
    """The outputs beside the one `decoded` keeps: {name: {"output": first sample, "modality"}}, or {name: {"why":
    ...}} for an array output no gate can judge. Names are the output object's fields (a tuple's items: `item1`, ...);
    a batch's samples after the first are `NAME_item2`, ... (with "item" and "of": its place and the batch size), so
    a batch of two prompts has both outputs gated, each against the baseline's same item."""
    array, modality = _whole(out)
    primary_name = next((attr for attr, _ in FIELDS if _payload(out)[0] is _field(out, attr)), "output")
    found: dict[str, dict[str, Any]] = _items(primary_name, array, modality)
    if isinstance(out, tuple):
        items = {f"item{i}": v for i, v in enumerate(out) if i and isinstance(v, (np.ndarray, torch.Tensor))}
        primary = None
    elif isinstance(out, (np.ndarray, torch.Tensor, list)) or _is_pil(out):
        return found
    else:
        fields = out if isinstance(out, dict) else {n: getattr(out, n) for n in _field_names(out)}
        items = {k: v for k, v in fields.items() if v is not None}
        primary = next((attr for attr, _ in FIELDS if attr in items), None)
    known = dict(FIELDS)
    for name, value in items.items():
        if name == primary or not (isinstance(value, (np.ndarray, torch.Tensor)) or
                                   (isinstance(value, list) and value and name in known)):
            continue
        try:
            array = _array(value)
            modality = known.get(name) or _by_shape(array)
            found[name] = {"output": np.ascontiguousarray(_first(array, modality), dtype=np.float32),
                           "modality": modality}
            found.update(_items(name, array, modality))
        except (DitgateError, ValueError, TypeError) as exc:
            found[name] = {"why": f"output {name!r} ({type(value).__name__}) cannot be judged: {exc}"}
    return found


def _field(out: Any, attr: str) -> Any:
    """An output object's field `attr` (None for a tuple, an array or a list, or a missing field)."""
    if isinstance(out, tuple) and out:
        return _field(out[0], attr)
    if isinstance(out, dict):
        return out.get(attr)
    return None if isinstance(out, (np.ndarray, torch.Tensor, list)) else getattr(out, attr, None)


def _field_names(out: Any) -> list[str]:
    """An output object's fields: a diffusers BaseOutput's keys, else its dataclass fields."""
    import dataclasses

    if hasattr(out, "keys") and callable(out.keys):
        return list(out.keys())
    return [f.name for f in dataclasses.fields(out)] if dataclasses.is_dataclass(out) else []
