"""Configs as nested dicts, and models built from them on the meta device (no memory) or for real (seeded, float32).

A config is read into a plain dict (diffusers' `load_config`, transformers' `to_dict`) and rewritten as one; a key is
a path of names (`("text_config", "num_hidden_layers")`). A build on the meta device allocates nothing, but a config
that lies (a layer count of 10**9) would still loop for ever: every build counts the modules and parameter elements
it registers and stops at `MAX_MODULES` / `MAX_ELEMENTS`, far above any released model; a layer count above
`MAX_LAYERS` is refused before anything is built.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ditgate.core.errors import DitgateError

MAX_MODULES = 500_000  # a 100-layer LLM registers about 2,000 modules; FLUX.1's transformer about 1,500
MAX_ELEMENTS = 2 * 10**12  # parameter elements of one component (the largest released DiTs hold about 10**11)
MAX_LAYERS = 10_000  # a config's layer or block count (released models: at most about 100), refused before building

Path_ = tuple[str, ...]


class TwinError(DitgateError):
    """A twin cannot be built from the source as given (the message says which component and why)."""


class TooBig(TwinError):
    """A config builds more modules or parameters than any real model has."""


@dataclass(frozen=True)
class Library:
    """Where a model class comes from: "diffusers" (ModelMixin) or "transformers" (PreTrainedModel)."""

    name: str


DIFFUSERS, TRANSFORMERS = Library("diffusers"), Library("transformers")


# ------------------------------------------------------------------------------------------------ config dicts
def read_json(file: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TwinError(f"{what}: cannot read {file} ({getattr(exc, 'strerror', None) or exc})") from None
    except json.JSONDecodeError as exc:
        raise TwinError(f"{what}: {file} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TwinError(f"{what}: {file} holds a JSON {type(data).__name__}, not an object")
    return data


def flatten(config: dict[str, Any], prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) of a nested config dict; a nested dict is walked, not yielded."""
    for key, value in config.items():
        if not isinstance(key, str) or key.startswith("_"):
            continue
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            yield from flatten(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def get(config: dict[str, Any], path: Path_) -> Any:
    for key in path:
        config = config[key]
    return config


def with_values(config: dict[str, Any], changes: dict[Path_, Any]) -> dict[str, Any]:
    """A copy of `config` with each path set to its new value."""
    out = copy.deepcopy(config)
    for path, value in changes.items():
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return out


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def dotted(path: Path_) -> str:
    return ".".join(path)


# ------------------------------------------------------------------------------------------------ building
@contextlib.contextmanager
def _guarded(what: str):
    """Stop a build that registers more modules or parameter elements than any real model."""
    import torch.nn.modules.module as module_mod

    counts = {"modules": 0, "elements": 0}

    def on_module(module, name, submodule):
        counts["modules"] += 1
        if counts["modules"] > MAX_MODULES:
            raise TooBig(f"{what}: its config builds more than {MAX_MODULES:,} modules; no real model has that many "
                         "(a layer count the config lies about?)")

    def on_param(module, name, param):
        if param is not None:
            counts["elements"] += param.numel()
            if counts["elements"] > MAX_ELEMENTS:
                raise TooBig(f"{what}: its config builds more than {MAX_ELEMENTS:.0e} parameters; no real model has "
                             "that many (a width or layer count the config lies about?)")

    handles = [module_mod.register_module_module_registration_hook(on_module),
               module_mod.register_module_parameter_registration_hook(on_param)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def instantiate(cls, library: Library, config: dict[str, Any]):
    """A model of `cls` from the config dict (on whatever device is current)."""
    if library is TRANSFORMERS:
        import torch

        return cls._from_config(cls.config_class.from_dict(config), dtype=torch.float32)
    return cls.from_config(config)


def on_meta(cls, library: Library, config: dict[str, Any], what: str):
    """The model on the meta device (nothing allocated); TwinError when the config does not build."""
    import torch

    for path, value in flatten(config):
        if is_int(value) and value > MAX_LAYERS and ("layers" in path[-1] or "blocks" in path[-1]):
            raise TooBig(f"{what}: {dotted(path)} is {value:,}; no real model has more than {MAX_LAYERS:,} layers "
                         "(a layer count the config lies about?)")
    first: BaseException | None = None
    for context in (lambda: torch.device("meta"), _empty_weights):
        try:
            with _guarded(what), context(), _quiet():
                return instantiate(cls, library, config)
        except TooBig:
            raise
        except Exception as exc:  # noqa: BLE001 - the config is the user's: any failure is reported, not handled
            first = first or exc
    raise TwinError(f"{what}: its config does not build {cls.__name__} ({one_line(first)})")


def _empty_weights():
    from accelerate import init_empty_weights

    return init_empty_weights(include_buffers=False)


@contextlib.contextmanager
def _quiet():
    """diffusers and transformers log every config key a class does not take; a rewritten config is no news."""
    import logging

    names = ("diffusers", "transformers")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


def for_real(cls, library: Library, config: dict[str, Any], seed: int, what: str):
    """The model with seeded float32 weights from the library's own initialisation, in eval mode."""
    import torch

    torch.manual_seed(seed)
    try:
        with _guarded(what), _quiet():
            model = instantiate(cls, library, config)
    except TooBig:
        raise
    except Exception as exc:  # noqa: BLE001
        raise TwinError(f"{what}: its twin config does not build {cls.__name__} ({one_line(exc)})") from None
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model = model.to(torch.float32)
    return model.eval()


def one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())
