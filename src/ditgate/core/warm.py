"""Pipelines a long-lived process keeps loaded for the commands it runs (`ditgate serve`).

The server loads a command's pipeline once, in host memory, before it forks the command; the forked command finds
it here and takes it instead of reading the folder again (`take`, called by `ditgate.core.loader.load`). A command
the server runs in its own process (a GPU command, or any with `--inline`) gives back the pristine pipeline its run
loaded when it ends (`give_back`), on its device: the next command on the same folder, dtype and class takes it. A kept
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

_kept: dict[tuple, Any] = {}  # key -> pipeline, most recently kept last
_between_commands = False  # this process runs one command after another in itself (`between_commands`)


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
    None. In a process that runs commands one after another (`between_commands`) a load of anything else lets every
    kept pipeline go first, with the memory it holds on a GPU; a command forked from the server keeps it (its memory
    is the server's, and a later load of the command may want it: a reduced-precision run loads its twin first)."""
    if not _kept:
        return None
    found = _kept.pop(key(path, dtype, pipeline), None)
    if found is None and _between_commands:
        drop()
    return found


def between_commands(on: bool) -> None:
    """Say whether this process runs commands one after another in itself (`ditgate serve` running a GPU command,
    or any with --inline): then a run gives back its pristine pipeline when it ends (`give_back`)."""
    global _between_commands
    _between_commands = on


def give_back(load_key: tuple, pipe) -> bool:
    """Keep `pipe`, a pipeline a finished run loaded under `load_key` (`key` taken before the load) and never ran or
    changed (its rows ran on copies: ditgate.run.exec.isolation.Pristine), for the next command of this process to
    take, where the process runs commands one after another (`between_commands`); False: not kept."""
    if not _between_commands:
        return False
    while len(_kept) >= KEEP:
        _kept.pop(next(iter(_kept)))
    _kept[load_key] = pipe
    return True


def kept() -> list[tuple]:
    return list(_kept)


def drop() -> None:
    """Forget every kept pipeline (and give back what a GPU held of them)."""
    if not _kept:
        return
    _kept.clear()
    release_memory()


def release_memory() -> None:
    """Free what pipelines let go of: a collection (pipelines hold reference cycles, so their memory goes only with
    one), then the GPU's cached blocks back to the device where this process used CUDA."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
