"""Pipelines a long-lived process keeps loaded for the commands it runs (`ditgate serve`).

The server loads a command's pipeline once, in host memory, before it forks the command; the forked command finds
it here and takes it instead of reading the folder again (`take`, called by `ditgate.core.loader.load`). A kept
pipeline is the one a fresh load would give: it is keyed by everything a load reads (the folder's files by
`folder_fingerprint`, the dtype, the pipeline class override) and it is never run or changed in the server, only in
the forked command's copy-on-write copy of it. A folder whose files changed since is loaded again. Code from the
model folder (`--trust-remote-code`) is never loaded into the server: such a command loads its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = {".json", ".yaml", ".yml", ".txt", ".py", ".model", ".jinja", ".md"}  # hashed by content
TEXT_LIMIT = 4 << 20  # a "text" file larger than this is fingerprinted by size and time, like a weight file
KEEP = 1  # pipelines kept at once: a large model's weights are held in host memory

_kept: dict[tuple, Any] = {}  # key -> pipeline on the CPU, most recently kept last


def folder_fingerprint(folder: Path) -> str:
    """Names, sizes and modification times of every file under `folder`; the content of its small text files."""
    digest = hashlib.sha256()
    folder = Path(folder)
    if not folder.is_dir():
        digest.update(str(folder).encode())
        return digest.hexdigest()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if path.suffix in TEXT_SUFFIXES and stat.st_size <= TEXT_LIMIT:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def key(path: Path, dtype: Any, pipeline: str | None) -> tuple:
    """What a kept pipeline is kept under (`dtype` a torch dtype)."""
    return (str(Path(path).resolve()), str(dtype), pipeline, folder_fingerprint(path))


def has(path: Path, dtype: Any, pipeline: str | None) -> bool:
    """Whether a pipeline is kept for this load (`dtype` a torch dtype); it becomes the most recently used."""
    wanted = key(path, dtype, pipeline)
    if wanted in _kept:
        _kept[wanted] = _kept.pop(wanted)
        return True
    return False


def keep(path: Path, dtype: Any, pipeline: str | None, pipe) -> None:
    """Keep `pipe`, loaded on the CPU from `path` (the least recently kept goes when KEEP are kept)."""
    while len(_kept) >= KEEP:
        _kept.pop(next(iter(_kept)))
    _kept[key(path, dtype, pipeline)] = pipe


def take(path: Path, dtype: Any, pipeline: str | None):
    """The kept pipeline for this load, handed over once (the next load in this process reads the folder), or
    None."""
    if not _kept:
        return None
    return _kept.pop(key(path, dtype, pipeline), None)


def kept() -> list[tuple]:
    return list(_kept)


def drop() -> None:
    """Forget every kept pipeline."""
    _kept.clear()
