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
