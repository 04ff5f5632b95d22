"""The example packages in the repository's `examples/` folder: `tinymm`, the code of `zoo:tinymm`.

A model folder whose `model_index.json` names such a package (`"_class_name": ["tinymm", "TinyMMPipeline"]`, or a
component `["tinymm.transformer_tinymm", ...]`) loads without installing it: `ensure_importable` puts `examples/` on
`sys.path` when the package cannot be imported otherwise. An installed package of the same name always wins.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.core.paths import data_root


def examples_dir() -> Path:
    return data_root() / "examples"


def ships(package: str) -> bool:
    """Whether `examples/` holds a package of this name."""
    try:
        return (examples_dir() / package / "__init__.py").is_file()
    except DitgateError:  # ditgate installed without its data files
        return False


def ensure_importable(package: str) -> bool:
    """Make `package` importable, from `examples/` if it is not installed; False when neither has it."""
    if importlib.util.find_spec(package) is not None:
        return True
    if not ships(package):
        return False
    folder = str(examples_dir())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return True


def ensure_packages(index: dict[str, Any]) -> list[str]:
    """Make every example package that `model_index.json` (`index`) names importable; returns their names."""
    named = [index.get("_class_name")] + [v for k, v in index.items() if not k.startswith("_")]
    packages = {str(v[0]).split(".")[0] for v in named if isinstance(v, (list, tuple)) and len(v) == 2 and v[0]}
    found = sorted(p for p in packages if ships(p) and ensure_importable(p))
    for package in found:  # imported: diffusers loads a component of a standard pipeline only from a module already
        importlib.import_module(package)  # imported (an example's transformer under diffusers' FluxPipeline)
    return found
