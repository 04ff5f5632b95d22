"""Where the skill's data files live: SKILL.md, references/, checklists/ (the gates among them), notebooks/ and
examples/.

One lookup, `data_root()`, in this order:
1. `$DITGATE_SKILL_DIR`, when set (a folder holding `checklists/`; anything else is a user error);
2. the checkout this package runs from (a folder above this file holding `checklists/` and `pyproject.toml`:
   an editable install or `PYTHONPATH=src`);
3. the copy shipped inside the installed package, `ditgate/_data` (a wheel or `pip install .`; the build copies
   the folders there, see setup.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from ditgate.core.errors import DitgateError

ENV = "DITGATE_SKILL_DIR"
# What the data folder holds: the skill and what it links to. A wheel ships these (setup.py reads this line) and
# `ditgate skill install` copies them.
DATA_PARTS: tuple[str, ...] = ("SKILL.md", "references", "checklists", "notebooks", "examples")
PACKAGED = Path(__file__).resolve().parents[1] / "_data"


def _holds_data(folder: Path) -> bool:
    return (folder / "checklists" / "gates.json").is_file()


def data_root() -> Path:
    """The folder that holds SKILL.md, references/, checklists/, notebooks/ and examples/ (see the module's doc)."""
    named = os.environ.get(ENV)
    if named:
        folder = Path(named).expanduser().resolve()
        if not _holds_data(folder):
            raise DitgateError(f"${ENV}={named} holds no checklists/gates.json; point it at a ditgate checkout or "
                               "unset it")
        return folder
    here = Path(__file__).resolve()
    for parent in here.parents:
        if _holds_data(parent) and (parent / "pyproject.toml").is_file():
            return parent
    if _holds_data(PACKAGED):
        return PACKAGED
    raise DitgateError(f"cannot find ditgate's data files (checklists/gates.json): not in ${ENV}, not in a checkout "
                       f"above {here}, not in {PACKAGED}; reinstall ditgate (`pip install ditgate` or "
                       "`pip install -e .` in a checkout)")


def checklists_dir() -> Path:
    return data_root() / "checklists"


def use_cache_dit(folder: str | os.PathLike) -> Path:
    """Import cache-dit from `folder` (the folder that holds the `cache_dit` package: a checkout's src/, an export's
    tree) in this process and every rank it starts (sys.path here, PYTHONPATH for torchrun). Called before anything
    imports cache_dit; a cache_dit already imported from elsewhere is an error."""
    import sys

    root = Path(folder).absolute()
    if not (root / "cache_dit" / "__init__.py").is_file():
        raise DitgateError(f"--cache-dit {folder}: no cache_dit package in that folder")
    loaded = sys.modules.get("cache_dit")
    if loaded is not None and Path(loaded.__file__).parent.parent != root:
        raise DitgateError(f"--cache-dit {folder}: cache_dit is already imported from {Path(loaded.__file__).parent}")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return root
