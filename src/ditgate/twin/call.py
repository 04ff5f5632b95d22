"""The twin's call (its `ditgate.json`), chosen on the built twin so that every feature of a run can act, and the
checks that it does.

- Size: the smallest height/width (and frame count for video) from a short list whose image tokens (those entering
  the first block of the first transformer called) split evenly over 2, 4 and 8 ranks (CP), found by calls cut
  short after the first transformer forward (`ditgate.twin.probe`).
- Steps: 4 (fewer when the source's call has fewer), more when a transformer of the pipeline (Wan 2.2's
  `transformer_2`) takes fewer than 3 of them (`CACHE_STEPS`: a cache row's warm-up then covers its steps).
- Guidance: a negative prompt where the call takes one (`NEGATIVE_PROMPT`).
- Text: `max_sequence_length`, where the call takes one, a multiple of 16 at least twice the prompt's tokens (so
  the prompt leaves padding), more where a chat template's system message fills that (`_max_sequence_length`), at
  most the pipeline's default; the prompt is the source call's or a short one.
- VAE tiling: arguments of `vae.enable_tiling` (or, for a VAE whose tile is its config's `sample_size`, that
  config key) with which the VAE decodes the call's latents in at least two tiles, counted by decoder calls.
- Input dependence: two seeds give two different first transformer outputs (a twin whose transformer output is
  constant cannot fail any gate).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core import loader, modular, request as request_mod
from ditgate.twin import probe
from ditgate.twin.meta import TwinError, one_line, read_json

PROMPT = "a tiny red cube on a table"
# Set where the call takes a negative prompt: a pipeline whose guidance needs one (Qwen-Image's true_cfg_scale) then
# calls its transformer twice per step, as in use and as cache-dit's adapter for it assumes (has_separate_cfg); with
# one call per step cache-dit counts half the steps and its warm-up covers all of them.
NEGATIVE_PROMPT = "blurry"
CP_RANKS = 8  # the token count divides by 8, so by 2 and 4 too
SIZES = (64, 128, 96, 192, 256)
FRAMES = (5, 9, 13, 17, 8, 16, 4)  # 4k+1 first: what causal video VAEs take without rounding
STEPS = 4
# Steps each transformer must take for a run's default cache row to act: it computes 2 warm-up steps
# (`run.define.rows.DEFAULT_CACHE`), then caches every other step; a second transformer (Wan 2.2's, after its
# boundary step) counts its own steps, so a pipeline of two gets more steps until each takes 3.
CACHE_STEPS = 3
MORE_STEPS = (6, 8, 12, 16)
_SIZED = ("height", "width", "num_inference_steps", "max_sequence_length")  # frames stay: a hint


@dataclass
class Choice:
    call: dict[str, Any]
    vae_tiling: dict[str, Any] = field(default_factory=dict)
    modality: str = "image"
    tokens: int | None = None
    tiles: int | None = None
    calls: dict[str, int] = field(default_factory=dict)  # transformer calls in the whole call
    output_change: float | None = None  # max |first output(seed 0) - first output(seed 1)|
    notes: list[str] = field(default_factory=list)
    vae_config: dict[str, Any] = field(default_factory=dict)  # VAE config keys set for its tiles


def base_call(source_call: dict[str, Any], layer_args: dict[str, Any], given: dict[str, Any],
              negative: bool = False) -> dict[str, Any]:
    """The source's call without its sizes, its layer arguments rewritten for the twin, a prompt (and a negative
    prompt where the call takes one: `negative`); then the call arguments the user gave (`given`), which the search
    leaves as they are."""
    call = {k: v for k, v in source_call.items() if k not in _SIZED}
    call.update(layer_args)
    call.setdefault("prompt", PROMPT)
    if negative:
        call.setdefault("negative_prompt", NEGATIVE_PROMPT)
    steps = source_call.get("num_inference_steps")
    call["num_inference_steps"] = min(STEPS, steps) if isinstance(steps, int) and steps > 0 else STEPS
    call.update(given)
    return call


def takes(pipeline_cls, name: str) -> bool:
    """Whether the pipeline's `__call__` takes `name` (a call taking **kwargs, a modular pipeline's, takes all)."""
    try:
        params = inspect.signature(pipeline_cls.__call__).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def choose(folder: Path, call: dict[str, Any], *, pipeline: str | None, trust_remote_code: bool,
           log: Callable[[str], None], given: frozenset[str] = frozenset(), frames: int | None = None,
           source_length: int | None = None) -> Choice:
    """Fit `call` on the twin at `folder` (its ditgate.json is rewritten as the search goes) and check it. The
    arguments named in `given` (and a `frames` count) are the user's: kept, not searched. `source_length`: the
    source call's max_sequence_length, tried when the chosen one fails at every size (a transformer whose text
    position table is that long: the zoo's CogVideoX 2B layout)."""
    log("loading the twin to choose its call")
    pipe = loader.load(folder, "float32", "cpu", pipeline=pipeline, trust_remote_code=trust_remote_code)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    params = _params(pipe, call)
    choice = Choice(call=dict(call))
    if "max_sequence_length" in params and "max_sequence_length" not in given:
        _max_sequence_length(folder, pipe, choice, params["max_sequence_length"], pipeline, trust_remote_code)
    try:
        _size(folder, pipe, choice, params, pipeline, trust_remote_code, log, given, frames)
    except TwinError as exc:
        chosen = choice.call.get("max_sequence_length")
        if not isinstance(source_length, int) or chosen in (None, source_length) or "max_sequence_length" in given:
            raise
        choice.call["max_sequence_length"] = source_length
        _size(folder, pipe, choice, params, pipeline, trust_remote_code, log, given, frames)
        choice.notes.append(f"max_sequence_length {source_length}, the source call's: at {chosen} {exc}")
    req = _request(folder, choice, pipeline, trust_remote_code)
    log(f"whole call: {_describe(choice.call)}")
    whole, latents = _whole(pipe, req)
    for steps in MORE_STEPS:
        if _enough(whole.calls, choice.call["num_inference_steps"]) or "num_inference_steps" in given \
                or choice.call["num_inference_steps"] >= steps:
            break
        choice.call["num_inference_steps"] = steps
        req = _request(folder, choice, pipeline, trust_remote_code)
        whole, latents = _whole(pipe, req)
    choice.calls = dict(whole.calls)
    idle = [name for name, n in whole.calls.items() if n == 0]
    if idle:
        choice.notes.append(f"{', '.join(idle)} not called in {choice.call['num_inference_steps']} steps")
    elif not _enough(whole.calls, choice.call["num_inference_steps"]):
        choice.notes.append(f"a transformer takes fewer than {CACHE_STEPS} of the {choice.call['num_inference_steps']}"
                            " steps: a cache's warm-up covers all of its steps, and a cache row cannot act on it")
    choice.modality = probe.modality(pipe, whole.result)
    _check_input_dependence(pipe, req, choice)
    if latents is not None and getattr(pipe, "vae", None) is not None:
        _tiling(folder, pipe, latents, choice, log)
    return choice


def _enough(calls: dict[str, int], steps: int) -> bool:
    """Whether every transformer takes CACHE_STEPS steps of its own (its calls over the calls per step)."""
    per_step = sum(calls.values()) / max(steps, 1)
    return bool(calls) and per_step > 0 and all(n / per_step >= min(CACHE_STEPS, steps) for n in calls.values())


def _params(pipe, call) -> dict[str, Any]:
    if modular.is_modular_class(type(pipe)):
        return {p.name: p.default for p in pipe.blocks.inputs if p.name}
    return {k: p.default for k, p in inspect.signature(type(pipe).__call__).parameters.items()}


def _prompt_tokens(pipe, prompt: str) -> int:
    from transformers import PreTrainedTokenizerBase

    counts = [0]
    for value in getattr(pipe, "components", {}).values():
        tok = value if isinstance(value, PreTrainedTokenizerBase) else getattr(value, "tokenizer", None)
        if isinstance(tok, PreTrainedTokenizerBase):
            counts.append(len(tok(prompt)["input_ids"]))
    return max(counts)


def _max_sequence_length(folder: Path, pipe, choice: Choice, default: Any, pipeline, trust_remote_code) -> None:
    """Twice the prompt's tokens (a multiple of 16, at least 32, at most the pipeline's default) where the text
    encoders' masks then show padding (or none takes a mask). Where they do not (FLUX.2's chat template puts a
    system message before the prompt: at 64 tokens the prompt was cut off), what they see at the default length
    plus the prompt's tokens again, if padding shows there; else (a template longer than any length, as the
    character-level stand-ins make HunyuanVideo's) the first length, which costs the least."""
    tokens = _prompt_tokens(pipe, str(choice.call.get("prompt", PROMPT)))
    limit = default if isinstance(default, int) and not isinstance(default, bool) and default > 0 else None
    length = max(32, -(-2 * tokens // 16) * 16)
    length = min(length, limit) if limit else length
    choice.call["max_sequence_length"] = length
    if not limit or length >= limit:
        return
    first = _text_probe(folder, pipe, choice, length, pipeline, trust_remote_code)
    if not first or any(n < size for n, size in first):
        return
    widest = _text_probe(folder, pipe, choice, limit, pipeline, trust_remote_code)
    if widest and any(n < size for n, size in widest):
        seen = max(n for n, _ in widest)
        choice.call["max_sequence_length"] = min(limit, -(-(seen + tokens) // 16) * 16)


def _text_probe(folder: Path, pipe, choice: Choice, length: int, pipeline, trust_remote_code):
    """What the text encoders' masks let through at `length` (`probe.text_tokens`), at the smallest size (only the
    text is read); empty when the call fails there (the size search below says why)."""
    params = _params(pipe, choice.call)
    small = {k: SIZES[0] for k in ("height", "width") if k in params}
    if _frame_key(params):
        small[_frame_key(params)] = FRAMES[0]
    trial = Choice(call={**small, **choice.call, "max_sequence_length": length})
    try:
        return probe.text_tokens(pipe, _request(folder, trial, pipeline, trust_remote_code))
    except Exception:  # noqa: BLE001 - a call that fails here fails the size search, which names the error
        return []


def _request(folder: Path, choice: Choice, pipeline, trust_remote_code) -> request_mod.Request:
    meta_file = folder / "ditgate.json"
    meta = read_json(meta_file, "twin") if meta_file.is_file() else {}
    meta["call"], meta["vae_tiling"] = choice.call, choice.vae_tiling
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    from ditgate.core.model import Model

    return Model.open(str(folder), pipeline=pipeline, trust_remote_code=trust_remote_code, device="cpu", dtype="float32").request


def _frame_key(params) -> str | None:
    return next((k for k in request_mod.FRAME_NAMES if k in params), None)


def _size(folder, pipe, choice: Choice, params, pipeline, trust_remote_code, log, given, fixed_frames) -> None:
    """The first candidate size whose tokens divide by CP_RANKS (else the first that runs, said in the notes)."""
    sized = "height" in params and "width" in params and not {"height", "width"} & given
    frame_key = _frame_key(params)
    if fixed_frames is not None and frame_key is None:
        raise TwinError("--frames: the twin's pipeline takes no frame count")
    frames = FRAMES if frame_key else (None,)
    own = choice.call.get(frame_key) if frame_key else None
    if isinstance(own, int) and own in FRAMES:
        frames = (own, *(f for f in FRAMES if f != own))
    if fixed_frames is not None:
        frames = (fixed_frames,)
    candidates = [(s, f) for f in frames for s in (SIZES if sized else (None,))]
    first_ok, last_error = None, None
    for size, frames in candidates[:12]:
        trial = dict(choice.call)
        if size:
            trial.update(height=size, width=size)
        if frames:
            trial[frame_key] = frames
        choice_try = Choice(call=trial)
        try:
            seen = probe.call(pipe, _request(folder, choice_try, pipeline, trust_remote_code), short=True)
        except Exception as exc:  # noqa: BLE001 - a size the pipeline refuses: the next one is tried
            last_error = exc
            continue
        tokens = seen.main_tokens
        log(f"  {_describe(trial)}: {tokens} tokens")
        if first_ok is None:
            first_ok = (trial, tokens)
        if tokens is not None and tokens % CP_RANKS == 0:
            choice.call, choice.tokens = trial, tokens
            return
    if first_ok is None:
        raise TwinError(f"the twin's call fails at every size tried ({one_line(last_error)})")
    choice.call, choice.tokens = first_ok
    choice.notes.append(f"no size tried gives a token count that {CP_RANKS} ranks split evenly "
                        f"({first_ok[1]} tokens): CP rows over 8 ranks cannot split it")


def _describe(call: dict[str, Any]) -> str:
    return ", ".join(f"{k}={call[k]}" for k in ("height", "width", *request_mod.FRAME_NAMES, "num_inference_steps")
                     if k in call)


def _whole(pipe, req):
    """The whole call with the VAE's input captured (the latents the tile check decodes)."""
    vae = getattr(pipe, "vae", None)
    captured = {}
    if vae is not None and hasattr(vae, "decode"):
        original = vae.decode

        def decode(z, *args, **kwargs):
            captured.setdefault("z", z.detach().clone())
            return original(z, *args, **kwargs)

        vae.decode = decode
    try:
        seen = probe.call(pipe, req)
    except Exception as exc:  # noqa: BLE001 - the twin's own call must run: say why it does not
        raise TwinError(f"the twin's call fails: {one_line(exc)}") from None
    finally:
        if vae is not None and "decode" in vars(vae):
            del vae.decode
    return seen, captured.get("z")


def _check_input_dependence(pipe, req, choice: Choice) -> None:
    first = probe.call(pipe, req, seed=req.seed, short=True)
    second = probe.call(pipe, req, seed=req.seed + 1, short=True)
    if first.output is None or second.output is None:
        choice.notes.append("no transformer output was seen: input dependence not checked")
        return
    change = float((first.output - second.output).abs().max())
    choice.output_change = change
    if not change > 0:
        raise TwinError(f"the twin's {first.transformer} gives the same output for two different inputs: no fault "
                        "could show in it")


def _tiling(folder: Path, pipe, latents, choice: Choice, log) -> None:
    vae = pipe.vae
    try:
        params = inspect.signature(vae.enable_tiling).parameters
        vae.enable_tiling()
        vae.disable_tiling()
    except (NotImplementedError, AttributeError, TypeError):
        choice.notes.append(f"{type(vae).__name__} has no tiled decode: VAE parallelism has nothing to split")
        return
    size = int(choice.call.get("height") or choice.call.get("width") or 64)
    plain = probe.decoder_calls(vae, latents, None)
    if plain == 0:
        choice.notes.append(f"{type(vae).__name__}'s decoder was not seen: tiles not counted")
        return
    for tile, stride in ((size // 2, size * 3 // 8), (size // 2, size // 4), (size // 4, size // 8)):
        if "tile_sample_min_height" in params:
            tiling = {k: tile for k in ("tile_sample_min_height", "tile_sample_min_width") if k in params}
            tiling.update({k: stride for k in ("tile_sample_stride_height", "tile_sample_stride_width") if k in params})
            tiles = probe.decoder_calls(vae, latents, tiling) // plain
            vae_config = {}
        elif hasattr(vae, "tile_sample_min_size") and "sample_size" in vae.config:
            tiling, vae_config = {}, {"sample_size": tile}
            tiles = _config_tiles(folder, vae, latents, tile, plain)
        else:
            choice.notes.append(f"{type(vae).__name__}'s tile size is not set by arguments or its config: tiles "
                                "not chosen")
            return
        log(f"  VAE tiles of {tile} (stride {stride}): {tiles} tiles")
        if tiles >= 2:
            choice.vae_tiling, choice.tiles, choice.vae_config = tiling, tiles, vae_config
            _write_tiling(folder, choice)
            return
    if "sample_size" in vae.config and hasattr(vae, "tile_sample_min_size"):
        _set_sample_size(folder, vae.config["sample_size"])
    choice.notes.append("no tile size tried decodes the call in two tiles or more")


def _config_tiles(folder: Path, vae, latents, tile: int, plain: int) -> int:
    """Decoder calls per plain decode with the VAE's config `sample_size` set to `tile` (the twin's config file
    is rewritten; the VAE is loaded again from it)."""
    import torch

    _set_sample_size(folder, tile)
    tiled = type(vae).from_pretrained(str(folder / "vae"), torch_dtype=torch.float32).eval()
    return probe.decoder_calls(tiled, latents, {}) // plain


def _set_sample_size(folder: Path, value) -> None:
    config_file = folder / "vae" / "config.json"
    config = read_json(config_file, "component vae")
    config["sample_size"] = value
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_tiling(folder: Path, choice: Choice) -> None:
    meta_file = folder / "ditgate.json"
    meta = read_json(meta_file, "twin")
    meta["vae_tiling"] = choice.vae_tiling
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
