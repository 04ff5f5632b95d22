"""The key of a stored row: a hash of everything the row's output depends on, and nothing else.

- the model folder: every file's name, size and modification time, and the content of its small text files
  (configs, tokenizer files, code), so a touched weight file or an edited config changes the key without hashing
  gigabytes of weights;
- the code a load runs from outside the folder and the libraries: the packages the model index names (an
  examples/ package such as zoo:tinymm's) and a --pipeline module, by content;
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

from ditgate.core.warm import folder_fingerprint

def reusable(row) -> bool:
    """Whether `row` is a reference row the store may hold: no gate of its own, no feature applied (the baseline,
    baseline-tiled, calibration, sensitivity and their prompt/seed copies)."""
    return row.phase is None and not (row.cache or row.parallel or row.quantize or row.compile)


@functools.lru_cache(maxsize=1)
def ditgate_code() -> str:
    """ditgate's version and the content of its own Python files (a changed runner can change a row's output)."""
    from ditgate import __version__

    package = Path(__file__).resolve().parents[2]  # src/ditgate
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


LIBRARIES = {"diffusers", "transformers", "torch"}  # their versions are in the key already


def model_code(model) -> str:
    """The source of the code a load runs from outside the model folder and the libraries: the packages its
    model_index.json (or modular_model_index.json) names, such as examples/ packages, and a --pipeline module."""
    import importlib.util

    from ditgate.core.examples import ensure_importable

    names = {str(model.pipeline).split(":")[0].split(".")[0]} if model.pipeline and ":" in model.pipeline else set()
    for index in ("model_index.json", "modular_model_index.json"):
        try:
            data = json.loads((Path(model.path) / index).read_text())
        except (OSError, ValueError):
            continue
        entries = [data.get("_class_name")] + list(data.values()) if isinstance(data, dict) else []
        names |= {str(v[0]).split(".")[0] for v in entries
                  if isinstance(v, (list, tuple)) and len(v) >= 2 and isinstance(v[0], str) and v[0]}
    digest = hashlib.sha256()
    for name in sorted(names - LIBRARIES):
        try:
            spec = importlib.util.find_spec(name) if ensure_importable(name) else None
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            continue
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
        for path in files:
            if "__pycache__" not in path.parts and path.is_file():
                digest.update(f"{name}/{path.relative_to(origin.parent)}\0".encode() + path.read_bytes())
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
    return {"model_files": folder_fingerprint(model.path), "model_code": model_code(model), "model": identity, "device_kind": device_kind(model.device),
            "versions": versions, "ditgate": ditgate_code(), "gates": gate_table(gates),
            "row": row.fingerprint(), "cp_split_dims": split_dims}


def row_key(model, row, versions: dict[str, Any], gates: Path | None, split_dims: Any) -> str:
    blob = json.dumps(parts(model, row, versions, gates, split_dims), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def key_in_run(cfg, run_dir: Path, row, integration) -> str | None:
    """The store key of `row` in a run of `cfg` (a RunConfig) writing `run_dir`, when the run reuses and the row may
    be stored; None otherwise."""
    from ditgate.core import plugin

    if not cfg.reuse or not reusable(row):
        return None
    split = integration.cp_split_dims if integration is not None else plugin.declared_split_dims()
    return row_key(cfg.model, row, versions_of(run_dir), cfg.gates, split)


def versions_of(run_dir: Path) -> dict[str, Any]:
    """The library versions the run folder's run.json records (the runner wrote them at its start)."""
    return json.loads((Path(run_dir) / "run.json").read_text()).get("versions", {})


def home() -> Path:
    return Path(os.environ.get("DITGATE_HOME", Path.home() / ".cache" / "ditgate"))

