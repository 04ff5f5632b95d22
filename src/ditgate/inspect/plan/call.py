"""The call a plan's Check commands make: the inspected request written back as options, the smallest sizes at which
CP (even splits over 2, 4 and 8 ranks) and VAE-P (two VAE tiles) can act, and the estimated cost of a call whose
size or step count falls back to the pipeline's defaults.

`request_args(model)` turns a `ditgate.core.model.Model` into the options every model command takes (pipeline,
remote-code consent, prompt, size, frames, steps, every other call argument as `--call KEY=JSON`, input image, seed,
dtype), so `ditgate run MODEL <args>` makes the call `ditgate inspect MODEL <args>` observed.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ditgate.core.request import FRAME_NAMES

CP_RANKS = 8  # 2, 4 and 8 all divide a multiple of 8
_NAMED = {"prompt": "--prompt", "height": "--height", "width": "--width", "num_inference_steps": "--steps"}


def request_args(model) -> list[str]:
    """The options that make `model`'s call again (see the module docstring)."""
    req = model.request
    args: list[str] = []
    if model.pipeline:
        args += ["--pipeline", model.pipeline]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    for key, value in req.call.items():
        if key == req.image_key or not _plain(value):
            continue  # the input image travels as --image; tensors and objects cannot be written as options
        if key in _NAMED and (key == "prompt" and isinstance(value, str) or key != "prompt" and _whole(value)):
            args += [_NAMED[key], str(value)]
        elif key in FRAME_NAMES and _whole(value):
            args += ["--frames", str(value)]
        else:
            args += ["--call", f"{key}={json.dumps(value)}"]
    if req.image and req.image != "generated":
        args += ["--image", str(req.image)]
    args += ["--seed", str(req.seed), "--dtype", model.dtype]
    return args


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def with_size(args: list[str], height: int | None, width: int | None) -> list[str]:
    """`args` with --height/--width replaced (left as they are where `height`/`width` is None)."""
    out, skip = [], False
    for i, item in enumerate(args):
        if skip:
            skip = False
            continue
        if item in ("--height", "--width") and (height if item == "--height" else width) is not None:
            skip = True
            continue
        out.append(item)
    return out + [x for flag, v in (("--height", height), ("--width", width)) if v is not None
                  for x in (flag, str(v))]


def quote(args: list[str]) -> str:
    return shlex.join(args)


# -- the smallest sizes at which CP and VAE-P act --------------------------------------------------------------------
@dataclass
class Sizes:
    """Where the call's size lets CP split evenly over 2/4/8 ranks and VAE-P decode in two tiles or more."""

    height: int | None = None
    width: int | None = None
    unit: int | None = None  # pixels per token side (VAE scale x patch)
    frames: int = 1  # token frames (latent frames after the temporal patch)
    tokens: int | None = None
    tile: int | None = None  # sample size of one VAE tile
    cp: tuple[int, int] | None = None  # smallest size >= the call's whose tokens divide by 8
    vaep: tuple[int, int] | None = None  # smallest size >= the call's that decodes in two tiles or more
    both: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unit(pipe, height: int, width: int, tokens: int, video: bool) -> tuple[int, int] | None:
    """(pixels per token side, token frames) consistent with `tokens` at `height` x `width`, or None."""
    vae = getattr(pipe, "vae_scale_factor_spatial", None) or getattr(pipe, "vae_scale_factor", None) or 8
    transformer = getattr(pipe, "transformer", None)
    patch = getattr(getattr(transformer, "config", None), "patch_size", None) or 1
    patch = patch[-1] if isinstance(patch, (list, tuple)) else patch
    for unit in dict.fromkeys((int(vae) * int(patch), int(vae) * 2, int(vae) * 4, int(vae))):
        if height % unit or width % unit:
            continue
        grid = (height // unit) * (width // unit)
        if tokens % grid == 0 and (video or tokens == grid):
            return unit, tokens // grid
    return None


def _tile(pipe, vae_tiling: dict[str, Any]) -> int | None:
    vae = getattr(pipe, "vae", None)
    for key in ("tile_sample_min_width", "tile_sample_min_height"):
        if vae_tiling.get(key):
            return int(vae_tiling[key])
    for key in ("tile_sample_min_width", "tile_sample_min_size"):
        value = getattr(vae, key, None)
        if isinstance(value, int):
            return value
        if isinstance(value, (list, tuple)) and value:
            return int(value[-1])
    return None


def phase_sizes(pipe, call: dict[str, Any], vae_tiling: dict[str, Any], tokens: int | None) -> Sizes:
    """The smallest sizes (height, width), at least the call's and in whole tokens, where CP and VAE-P act."""
    height, width = call.get("height"), call.get("width")
    sizes = Sizes(height=height, width=width, tokens=tokens, tile=_tile(pipe, vae_tiling))
    if not (_whole(height) and _whole(width) and tokens):
        sizes.notes.append("the call gives no height and width (or no tokens were seen): the sizes where CP and "
                           "VAE-P act were not computed; pass --height and --width")
        return sizes
    video = any(k in call for k in FRAME_NAMES)
    found = _unit(pipe, height, width, tokens, video)
    if found is None:
        sizes.notes.append(f"{tokens} tokens at {height}x{width} match no whole token grid: sizes not computed")
        return sizes
    sizes.unit, sizes.frames = found
    unit = sizes.unit
    candidates = sorted(((height + i * unit, width + j * unit) for i in range(9) for j in range(65)),
                        key=lambda hw: (hw[0] * hw[1], hw[0] != height, hw))

    def cp_ok(hw):
        return sizes.frames * (hw[0] // unit) * (hw[1] // unit) % CP_RANKS == 0

    def vae_ok(hw):
        return sizes.tile is not None and max(hw) > sizes.tile

    sizes.cp = next((hw for hw in candidates if cp_ok(hw)), None)
    if sizes.tile is None:
        sizes.notes.append("the VAE's tile size is unknown: the size where VAE-P acts was not computed")
    else:
        sizes.vaep = next((hw for hw in candidates if vae_ok(hw)), None)
        sizes.both = next((hw for hw in candidates if vae_ok(hw) and cp_ok(hw)), None)
    return sizes


def size_lines(sizes: Sizes) -> list[str]:
    """What the plan says about the sizes its CP, VAE-P and testing commands use."""
    if sizes.unit is None:
        return [f"- {n}" for n in sizes.notes]
    at = f"{sizes.height}x{sizes.width}"
    lines = [f"- one token per {sizes.unit}x{sizes.unit} pixels ({sizes.frames} token frame(s)): {sizes.tokens} "
             f"tokens at {at}"]
    if sizes.cp == (sizes.height, sizes.width):
        lines.append(f"- CP: {sizes.tokens} tokens split evenly over 2, 4 and 8 ranks at the call's size")
    elif sizes.cp:
        lines.append(f"- CP: {sizes.tokens} tokens do not split evenly over 2, 4 and 8 ranks; the smallest size that "
                     f"does is {sizes.cp[0]}x{sizes.cp[1]} (the CP commands below use it)")
    if sizes.vaep == (sizes.height, sizes.width):
        lines.append(f"- VAE-P: the call decodes in two VAE tiles or more (tile {sizes.tile})")
    elif sizes.vaep:
        lines.append(f"- VAE-P: at {at} the image fits one VAE tile ({sizes.tile} pixels): VAE-P cannot act; the "
                     f"smallest size with two tiles is {sizes.vaep[0]}x{sizes.vaep[1]} (the VAE-P command uses it)")
    return lines + [f"- {n}" for n in sizes.notes]


# -- the cost of a call that falls back to the pipeline's defaults ---------------------------------------------------
def cpu_rate(seconds: float = 0.05) -> float:
    """FLOP/s of float32 matrix products on this CPU, measured now (about `seconds`)."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * 256 ** 3 * count / (time.perf_counter() - start)


def _defaults(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """The call's height, width and frames, each from the call, else the signature's default, else the pipeline's
    default sample size."""
    import inspect as pyinspect

    params = pyinspect.signature(type(pipe).__call__).parameters
    out = {}
    for key in ("height", "width", *FRAME_NAMES):
        value = call.get(key)
        if value is None and key in params and _whole(params[key].default):
            value = params[key].default
        if value is None and key in ("height", "width"):
            sample = getattr(pipe, "default_sample_size", None)
            scale = getattr(pipe, "vae_scale_factor", None)
            value = sample * scale if _whole(sample) and _whole(scale) else None
        if value is not None:
            out[key] = value
    return out


def default_cost(model, pipe, call: dict[str, Any], limit_s: float) -> str | None:
    """A line announcing the call's cost when its size or steps fall back to the pipeline's defaults on a CPU and
    the estimate from the FLOP count is above `limit_s` seconds; None when the call is the user's or cheap."""
    from ditgate.core.errors import DitgateError
    from ditgate.inspect.flops import profile as flops

    req = model.request.call
    fallback = [k for k in ("height", "width") if k not in req]
    if model.request.steps_from != "request":
        fallback.append("steps")
    if not fallback or not str(model.device).startswith("cpu"):
        return None
    sized = _defaults(pipe, call)
    frames = next((sized[k] for k in FRAME_NAMES if k in sized), None)
    steps = call.get("num_inference_steps") or 1
    what = (f"{frames} frames of " if frames else "") + f"{sized.get('height')}x{sized.get('width')}, {steps} steps"
    try:
        profile = flops.analyze(model.path, height=int(sized["height"]), width=int(sized["width"]), frames=frames,
                                dtype="float32")
    except (DitgateError, KeyError, ValueError, TypeError) as exc:
        return (f"the call takes {', '.join(fallback)} from the pipeline's defaults ({what}); its cost could not be "
                f"estimated ({exc}); a call at the user's size is the one to inspect")
    total = profile.flops() * steps * (profile.calls_per_step or 1)
    seconds = total / cpu_rate()
    if seconds <= limit_s:
        return None
    return (f"the call takes {', '.join(fallback)} from the pipeline's defaults ({what}): about {total / 1e12:.1f} "
            f"TFLOP in the transformer, about {_duration(seconds)} on this CPU; stop it and pass the user's call "
            "(--height/--width/--frames/--steps) to inspect that instead")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def announce_above() -> float:
    """Seconds above which a default call's estimated cost is announced (gates.json, rules.call_cost)."""
    from ditgate.core.paths import checklists_dir

    return float(json.loads((checklists_dir() / "gates.json").read_text())["rules"]["call_cost"]["announce_above_s"])
