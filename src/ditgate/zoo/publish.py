"""Writing a model folder so that it is complete or absent: build it in a hidden staging folder beside its target,
then rename. Shared by the zoo (`zoo build`, the zoo cache) and the twin builder (`ditgate twin`, the twin cache).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ditgate.core.errors import DitgateError

INDEX_FILES = ("model_index.json", "modular_model_index.json")


def has_index(folder: Path) -> bool:
    """Whether `folder` holds a pipeline (its model_index.json or modular_model_index.json)."""
    return any((Path(folder) / name).is_file() for name in INDEX_FILES)


def check_target(target: Path, overwrite: bool) -> None:
    """Refuse to write a model into a file, into a non-empty folder without `overwrite`, or over a folder that
    holds something other than a model (`--overwrite` replaces a model, nothing else)."""
    if target.exists() and not target.is_dir():
        raise DitgateError(f"{target} is a file; give a folder to build the model in")
    occupied = target.is_dir() and any(target.iterdir())
    if occupied and not overwrite:
        raise DitgateError(f"{target} exists and is not empty; use --overwrite to replace it")
    if occupied and not has_index(target):
        raise DitgateError(f"{target} holds files but no model (no model_index.json); --overwrite does not replace "
                           "it: give an empty or new folder")


def staged(parent: Path, name: str, fill: Callable[[Path], None]) -> Path:
    """A fresh hidden folder under `parent`, filled by `fill(folder)`; removed again on any failure."""
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.building.", dir=parent))
    try:
        fill(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def replace(staging: Path, target: Path) -> Path:
    """Put the finished `staging` folder at `target`, replacing what is there (the old folder is removed last)."""
    if target.exists():
        old = staging.with_name(staging.name + ".old")
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        staging.rename(target)
    return target


def publish_once(staging: Path, target: Path) -> Path:
    """Publish a cache entry: rename `staging` to `target`, unless another process published it first."""
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not has_index(target):
            raise
    return target


def wait_for(target: Path, who: str, timeout: float = 600) -> Path:
    """Wait until another process (rank 0) has published `target`."""
    deadline = time.monotonic() + timeout
    while not has_index(target):
        if time.monotonic() > deadline:
            raise DitgateError(f"{who} waited {timeout:.0f} s for rank 0 to build {target}")
        time.sleep(0.5)
    return target
