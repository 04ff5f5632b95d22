"""Where the project's data files live: the repository root holds SKILL.md, references/, checklists/, notebooks/."""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The repository this package was installed from (editable install or source checkout)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "checklists").is_dir() and (parent / "pyproject.toml").is_file():
            return parent
    raise FileNotFoundError("cannot find the ditgate repository (checklists/ next to pyproject.toml) above "
                            f"{here}; install ditgate from a checkout with `pip install -e .`")


def checklists_dir() -> Path:
    return repo_root() / "checklists"
