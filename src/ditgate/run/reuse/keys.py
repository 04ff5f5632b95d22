"""The key of a stored row: a hash of everything the row's output depends on, and nothing else.

- the model folder: every file's name, size and modification time, and the content of its small text files
  (configs, tokenizer files, code), so a touched weight file or an edited config changes the key without hashing
  gigabytes of weights;
- the model as the run opened it: path, pipeline class, request (prompt, size, steps, seed, call), dtype, device;
- the device kind (a GPU's name and compute capability; a CPU's thread count, which orders its sums);
- the library versions recorded in the run folder's run.json (torch, diffusers, transformers, cache-dit and the
  folder it came from, Python) and ditgate's own version and code;
- the gate table the run judges with (a changed table may change what a reference row is for);
- the row's own definition (its fingerprint) and, for the plugin, only what a reference row records of it: the CP
  split dimensions. A reference row applies no cache, no parallelism, no plugin hook.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = {".json", ".yaml", ".yml", ".txt", ".py", ".model", ".jinja", ".md"}  # hashed by content
TEXT_LIMIT = 4 << 20  # a "text" file larger than this is fingerprinted by size and time, like a weight file


def reusable(row) -> bool:
    """Whether `row` is a reference row the store may hold: no gate of its own, no feature applied (the baseline,
    baseline-tiled, calibration, sensitivity and their prompt/seed copies)."""
    return row.phase is None and not (row.cache or row.parallel or row.quantize or row.compile)


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


@functools.lru_cache(maxsize=1)
def ditgate_code() -> str:
    """ditgate's version and the content of its own Python files (a changed runner can change a row's output)."""
    from ditgate import __version__

    package = Path(__file__).resolve().parents[2]  # src/ditgate
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def device_kind(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{torch.cuda.get_device_name(index)}:sm{major}{minor}"
    return f"{device}:threads={torch.get_num_threads()}"


def gate_table(path: Path | None) -> str:
    from ditgate.gates.verdicts import DEFAULT_GATES

    return hashlib.sha256(Path(path or DEFAULT_GATES).read_bytes()).hexdigest()


def parts(model, row, versions: dict[str, Any], gates: Path | None, split_dims: Any) -> dict[str, Any]:
    """The key's parts, by name (what `row_key` hashes; a test changes one at a time)."""
    identity = model.to_dict()
    identity.pop("name", None)  # what the model is called does not change its output
    return {"model_files": folder_fingerprint(model.path), "model": identity, "device_kind": device_kind(model.device),
            "versions": versions, "ditgate": ditgate_code(), "gates": gate_table(gates),
            "row": row.fingerprint(), "cp_split_dims": split_dims}


def row_key(model, row, versions: dict[str, Any], gates: Path | None, split_dims: Any) -> str:
    blob = json.dumps(parts(model, row, versions, gates, split_dims), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def versions_of(run_dir: Path) -> dict[str, Any]:
    """The library versions the run folder's run.json records (the runner wrote them at its start)."""
    return json.loads((Path(run_dir) / "run.json").read_text()).get("versions", {})


def home() -> Path:
    return Path(os.environ.get("DITGATE_HOME", Path.home() / ".cache" / "ditgate"))
