"""Twin components with real weights: seeded float32 from the library's own initialisation, saved for
`from_pretrained`.

Where a diffusers model (not the VAE, kept as diffusers makes it) initialises a parameter to zero (an adaLN-zero
modulation, a zero `proj_out` or `final_linear`), the twin draws it again as its layer type would by default (uniform
in +-1/sqrt(fan_in), seeded): a block whose gate is zero adds nothing, and a transformer whose output layer is zero
outputs a constant, so no integration fault could show in it. The call check (`ditgate.twin.call`) then proves the output depends on the input.
"""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path
from typing import Any

from ditgate.twin.meta import DIFFUSERS, count, for_real
from ditgate.twin.source import WEIGHT_SUFFIXES, Component

# The depth knobs of a VAE that cut no width, no down-sampling and no tile: resnets per resolution level.
VAE_KNOBS = ("layers_per_block", "num_res_blocks")


def seed_of(seed: int, name: str) -> int:
    """A component's own seed: the twin's seed and its name (components differ; builds repeat)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


def is_vae(component: Component) -> bool:
    return component.name.startswith("vae") or component.class_name.startswith("Autoencoder")


def _zero(param) -> bool:
    return param is not None and param.numel() > 0 and not bool(param.any())


def zero_initialised(model) -> list[str]:
    """Parameters the model's own initialisation left at zero on purpose: an all-zero weight (2-D and up) and its
    bias, or an all-zero parameter of its own (a gate, a modulation table). A zero bias beside a drawn weight or a
    norm's zero shift is every layer's default, not a zero-initialised layer."""
    names = []
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        own = dict(module.named_parameters(recurse=False))
        weight_zero = _zero(own.get("weight")) and own["weight"].dim() >= 2
        for name, param in own.items():
            if not _zero(param):
                continue
            if param.dim() >= 2 or (name == "bias" and weight_zero) or name not in ("bias", "weight"):
                names.append(prefix + name)
    return names


def redraw_zeros(model, seed: int) -> list[str]:
    """Draw every zero-initialised parameter again (see the module docstring); the names of those drawn."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    drawn = []
    targets = set(zero_initialised(model))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name not in targets:
                continue
            fan_in = param[0].numel() if param.dim() >= 2 else param.numel()
            bound = 1.0 / math.sqrt(max(fan_in, 1))
            noise = torch.rand(param.shape, generator=generator, dtype=torch.float32) * 2 - 1
            param.copy_(noise * bound)
            drawn.append(name)
    return drawn


def build(component: Component, config: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    """Build `component` from its twin `config` with seeded weights and save it into `out`; what was done."""
    what = f"component {component.name}"
    model = for_real(component.cls, component.library, config, seed_of(seed, component.name), what)
    drawn = [] if component.library is not DIFFUSERS or is_vae(component) else \
        redraw_zeros(model, seed_of(seed + 1, component.name))
    params = count(model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    copy_extras(component.folder, out)
    return {"params": params, "redrawn": drawn}


def copy_extras(source: Path | None, out: Path) -> None:
    """The component folder's other files (generation config, preprocessor config, chat template, code), never a
    weight, a weight index or the config the twin rewrote."""
    if source is None:
        return
    for file in source.iterdir():
        if not file.is_file() or file.name == "config.json" or file.name.endswith(WEIGHT_SUFFIXES) \
                or ".safetensors.index" in file.name or ".bin.index" in file.name:
            continue
        shutil.copy2(file, out / file.name)


def copy_folder(source: Path, out: Path) -> None:
    """A component kept as files (scheduler, tokenizer, processor): every file but weights."""
    shutil.copytree(source, out, ignore=lambda d, names: [n for n in names if n.endswith(WEIGHT_SUFFIXES)],
                    dirs_exist_ok=True)
