"""The generation request every row runs: the pipeline call arguments, the seed and the input image.

One request object serves every command (run, inspect, matrix, checklist, notebook, diff). Its call arguments come,
each overriding the one before, from the model folder's `ditgate.json` ("call", the zoo writes it; a user may write
one too), a `--call-file FILE` (JSON or YAML), `--call KEY=VALUE` options and the named flags (`--prompt`,
`--height`, `--width`, `--frames`, `--steps`). Nothing else is added (no negative prompt, no guidance scale) but
what `added` lists: a test prompt where none was given, a seeded test image where the pipeline requires one (an
optional `image` stays out; `--call image=null` passes None), the signature's default step count by name.

`resolve(request, pipeline_class)` fits it to the pipeline's `__call__` before anything runs: the frame count goes
under the name the signature uses, the step count comes from the signature's default when not given, an input
image goes to the signature's image argument (a seeded test image when the pipeline needs one and none was given),
and an argument the pipeline does not take is refused. The same request, with a fresh CPU generator seeded
identically, is used by every row and every rank.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError

DEFAULT_PROMPT = "a red cube on a wooden table, studio light"
FRAME_NAMES = ("num_frames", "video_length", "num_video_frames", "frames", "frame_num", "num_latent_frames")
IMAGE_NAMES = ("image", "image_reference", "control_image", "ref_image", "input_image")
# Pipelines whose name says they transform an input image (they need one even where `image` has a default)
_NEEDS_IMAGE = re.compile(r"ImageToVideo|Image2Video|I2V|Img2Img|Edit|Inpaint|Control|Kontext|VisualCloze")
_SIZED = ("height", "width", "num_inference_steps")
# Call arguments ditgate passes itself, whatever the request says: a value given for one would be replaced silently
# while the report recorded it as used, so it is refused (ditgate reads the output as NumPy and the final latents
# through its own step callback, and seeds its own generator).
OWN_ARGUMENTS = ("output_type", "callback_on_step_end", "callback_on_step_end_tensor_inputs", "callback",
                 "callback_steps", "generator")
# Outputs per prompt: ditgate compares one output per prompt, so more than one would go unchecked.
PER_PROMPT = ("num_images_per_prompt", "num_videos_per_prompt", "num_waveforms_per_prompt", "num_audios_per_prompt")


@dataclass(frozen=True)
class Request:
    call: dict[str, Any] = field(default_factory=dict)  # keyword arguments of pipe(...)
    seed: int = 0
    vae_tiling: dict[str, Any] = field(default_factory=dict)  # keyword arguments of pipe.vae.enable_tiling(...)
    frames: int | None = None  # --frames, before `resolve` puts it under the signature's name
    image: str | None = None  # --image FILE; "generated" for ditgate's seeded test image
    image_key: str | None = None  # the __call__ argument the image goes to (set by `resolve`)
    steps_from: str = "request"  # where the step count came from: request, signature or unknown

    @property
    def steps(self) -> int | None:
        return self.call.get("num_inference_steps")

    def to_dict(self) -> dict[str, Any]:
        out = {"call": dict(self.call), "seed": self.seed, "vae_tiling": dict(self.vae_tiling)}
        for key in ("frames", "image", "image_key"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.steps_from != "request":
            out["steps_from"] = self.steps_from
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Request":
        return cls(**data)


def parse_call_options(items: list[str] | None) -> dict[str, Any]:
    """`--call KEY=VALUE` options: VALUE parsed as JSON (numbers, lists, true/false/null), else kept as a string."""
    call: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise DitgateError(f"--call {item!r}: expected KEY=VALUE with KEY a Python identifier")
        try:
            call[key] = json.loads(text)
        except ValueError as exc:
            if text.lstrip()[:1] in ("[", "{"):  # meant as a list or mapping: passing it on as a string would fail
                raise DitgateError(f"--call {item!r}: the value is not valid JSON ({exc})") from None
            call[key] = text
    return call


def read_call_file(path: str | Path | None) -> dict[str, Any]:
    """`--call-file FILE`: a JSON or YAML mapping of call arguments."""
    if path is None:
        return {}
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DitgateError(f"--call-file {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error of a user's file is a usage error
        raise DitgateError(f"--call-file {path}: not valid {path.suffix.lstrip('.') or 'JSON'}: "
                           f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise DitgateError(f"--call-file {path}: expected a mapping of argument names to values")
    return data


def build(meta: dict[str, Any], *, prompt: str | None = None, height: int | None = None, width: int | None = None,
          frames: int | None = None, steps: int | None = None, seed: int = 0,
          extra: dict[str, Any] | None = None, image: str | None = None) -> Request:
    """Request from the folder's metadata (`meta["call"]`, may be empty), then `extra` (call file and --call), then
    the named values."""
    for where, given in (("ditgate.json \"call\"", meta.get("call", {})), ("--call/--call-file", extra or {})):
        _refuse_overridden(given, where)
    call = dict(meta.get("call", {}))
    call.update(extra or {})
    call.setdefault("prompt", DEFAULT_PROMPT)
    for key, value in (("prompt", prompt), ("height", height), ("width", width), ("num_inference_steps", steps)):
        if value is not None:
            call[key] = value
    for key in (*_SIZED, "num_frames"):
        if key in call and (isinstance(call[key], bool) or not isinstance(call[key], int) or call[key] < 1):
            raise DitgateError(f"{key} must be a positive integer, got {call[key]!r}")
    if frames is not None and frames < 1:
        raise DitgateError(f"--frames must be a positive integer, got {frames}")
    if image is not None and image != "generated" and not Path(image).is_file():
        raise DitgateError(f"--image {image}: no such file")
    return Request(call=call, seed=seed, vae_tiling=dict(meta.get("vae_tiling", {})), frames=frames, image=image)


def _refuse_overridden(call: dict[str, Any], where: str) -> None:
    """Refuse call arguments ditgate cannot honour (see OWN_ARGUMENTS and PER_PROMPT)."""
    own = sorted(k for k in call if k in OWN_ARGUMENTS)
    if own:
        raise DitgateError(f"{where}: {', '.join(own)} cannot be set: ditgate passes it itself (it reads the output "
                           "as NumPy arrays, the final latents through its own step callback, and seeds its own "
                           "generator); remove it")
    for key in PER_PROMPT:
        value = call.get(key)
        if value is not None and (isinstance(value, bool) or value != 1):
            raise DitgateError(f"{where}: {key}={value!r} is not supported: ditgate gates one output per prompt; "
                               "to judge more outputs, give more prompts or seeds (--prompts FILE, --seeds N)")


def _parameters(cls) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls.__call__).parameters)


def resolve(request: Request, cls) -> Request:
    """`request` fitted to `cls.__call__` (see the module docstring); DitgateError when it cannot be."""
    from ditgate.core import modular

    if modular.is_modular_class(cls):  # the blocks' inputs say what it takes: see fit_blocks
        return request if request.frames is None else replace(
            request, call={**request.call, "num_frames": request.frames}, frames=None)
    return _fit(request, _parameters(cls), f"{cls.__name__}.__call__", cls.__name__)


def fit_blocks(request: Request, pipe, standard_class: str | None = None, strict: bool = True) -> Request:
    """`request` fitted to a modular pipeline's blocks by the same rules, their inputs (and the guider's arguments)
    taking the place of `__call__`'s parameters; an input image is needed when the blocks require it or the
    folder's standard class (`standard_class`) transforms one. Not `strict`: arguments no block takes are kept."""
    from ditgate.core import modular

    params = modular.block_parameters(pipe, request.call)
    if not strict:
        params.update({k: inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
                       for k in request.call if k not in params})
    return _fit(request, params, f"{type(pipe).__name__} (its blocks)", standard_class or type(pipe).__name__)


def _fit(request: Request, params: dict[str, inspect.Parameter], name: str, kind: str) -> Request:
    """`request` fitted to `params` (of what `name` says); `kind` is the class name that may say it needs an image."""
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    call = dict(request.call)
    if call.get("prompt") == DEFAULT_PROMPT and "prompt" not in params and not takes_any:
        del call["prompt"]  # ditgate's own test prompt, for a pipeline prompted otherwise (class labels, tasks)
    if request.frames is not None:
        key = next((k for k in FRAME_NAMES if k in params), None)
        if key is None:
            raise DitgateError(f"--frames: {name} takes no frame count (none of {', '.join(FRAME_NAMES)}); "
                               "pass the pipeline's own argument with --call NAME=VALUE")
        call[key] = request.frames
    steps_from = request.steps_from
    if "num_inference_steps" not in call:
        default = params.get("num_inference_steps")
        if default is not None and isinstance(default.default, int) and not isinstance(default.default, bool):
            call["num_inference_steps"], steps_from = default.default, "signature"
        else:
            steps_from = "unknown"
    image, image_key = request.image, None
    candidates = [k for k in IMAGE_NAMES if k in params]
    if image is not None:
        if not candidates:
            raise DitgateError(f"--image: {name} takes no input image (none of {', '.join(IMAGE_NAMES)})")
        image_key = candidates[0]
    elif candidates and candidates[0] not in call and _needs_image(kind, params[candidates[0]]):
        image, image_key = "generated", candidates[0]
    unknown = sorted(k for k in call if k not in params) if not takes_any else []
    if unknown:
        raise DitgateError(f"{name} does not accept {', '.join(unknown)}")
    return replace(request, call=call, frames=None, image=image, image_key=image_key, steps_from=steps_from)


def _needs_image(kind: str, param: inspect.Parameter) -> bool:
    return param.default is inspect.Parameter.empty or bool(_NEEDS_IMAGE.search(kind))


def test_image(width: int, height: int, seed: int = 0):
    """ditgate's input image for pipelines that need one: a seeded colour gradient with blocks, as a user's photo
    would have structure at every scale (PIL, RGB)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width, 1)
    rgb = np.stack([x, y, 1.0 - (x + y) / 2], axis=-1)
    cell = max(4, min(width, height) // 4)
    blocks = rng.random((height // cell + 1, width // cell + 1, 3))
    rgb = 0.6 * rgb + 0.4 * np.kron(blocks, np.ones((cell, cell, 1)))[:height, :width]
    return Image.fromarray((np.clip(rgb, 0, 1) * 255).round().astype(np.uint8), "RGB")


def input_image(request: Request):
    """The PIL image the call passes under `request.image_key` (None when it passes none)."""
    if request.image_key is None or request.image is None:
        return None
    if request.image == "generated":
        return test_image(int(request.call.get("width") or 64), int(request.call.get("height") or 64), request.seed)
    from PIL import Image

    try:
        with Image.open(request.image) as img:
            return img.convert("RGB")
    except OSError as exc:
        raise DitgateError(f"--image {request.image}: not an image PIL can read ({exc})") from None


def added(request: Request) -> dict[str, str]:
    """What ditgate put into the call that the user did not give, each with its reason (report.json
    `added_to_call`, report.md): its test prompt where none was given, its seeded test image where the pipeline
    requires an input image, the pipeline's own default step count passed by name. Nothing else is added."""
    found = {}
    if request.call.get("prompt") == DEFAULT_PROMPT:
        found["prompt"] = f"ditgate's test prompt {DEFAULT_PROMPT!r}: none was given (--prompt sets one)"
    if request.image == "generated" and request.image_key:
        found[request.image_key] = ("ditgate's seeded test image of the call's size: the pipeline requires an input "
                                    "image (no default, or its class transforms one); --image FILE gives yours")
    if request.steps_from == "signature":
        found["num_inference_steps"] = (f"{request.steps}, the pipeline's own default, passed by name so that "
                                        "every row counts the same steps")
    return found


def call_kwargs(pipe, request: Request) -> dict[str, Any]:
    """The request's arguments for `pipe(...)`, checked against what `pipe.__call__` accepts, the image included."""
    params = _parameters(type(pipe))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in request.call.items() if takes_any or k in params}
    dropped = sorted(set(request.call) - set(kwargs))
    if dropped:
        raise DitgateError(f"{type(pipe).__name__} does not accept {', '.join(dropped)}")
    image = input_image(request)
    if image is not None:
        kwargs[request.image_key] = image
    return kwargs


def resolve_device(device: str) -> str:
    """`device`, with "auto" resolved to cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    """`device` and `dtype` with "auto" resolved: the one default of every command and notebook."""
    device = resolve_device(device)
    return device, resolve_dtype(dtype, device)


def resolve_dtype(dtype: str, device: str) -> str:
    """`dtype`, with "auto" resolved to bfloat16 on a GPU (how real models run), else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(device).startswith("cuda") else "float32"
