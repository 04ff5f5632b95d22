"""Install the skill where agents look for it: `<project>/.agents/skills/<name>/` (and/or `.github/skills/`,
`.claude/skills/`), or straight into a skills directory.

The installed folder holds SKILL.md, references/, checklists/ and notebooks/ exactly as they are in the repository,
so every relative link keeps resolving without being rewritten; the linter's `portable` rule makes sure no link
leaves those parts. `link=True` places a symlink to the repository instead of a copy. A folder is built under a
temporary name beside its destination and renamed into place, so no half-written skill is ever visible.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from ditgate.core.errors import DitgateError
from ditgate.core.paths import data_root
from ditgate.skill.base import INSTALLED_PARTS, SKILL_FILE, stray_links
from ditgate.skill.markdown import split_frontmatter
from ditgate.skill.spec import NAME_PATTERN

LAYOUTS: dict[str, str] = {"agents": ".agents/skills", "github": ".github/skills", "claude": ".claude/skills"}
_IGNORE = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc", ".DS_Store")


class SkillInstallError(DitgateError):
    """The skill cannot be installed from this source or into this target."""


class SkillExistsError(SkillInstallError, FileExistsError):
    """The destination already holds a skill and `force` was not given."""


@dataclass(frozen=True)
class InstallResult:
    name: str
    source: Path
    paths: tuple[Path, ...]
    linked: bool
    parts: tuple[str, ...]


def default_source() -> Path:
    """The repository this package runs from, when it holds the skill; else the current folder."""
    try:
        repo = data_root()
    except DitgateError:
        return Path.cwd()
    return repo if (repo / SKILL_FILE).is_file() else Path.cwd()


def skill_name(source: Path) -> str:
    path = source / SKILL_FILE
    if not path.is_file():
        raise SkillInstallError(f"{source} holds no {SKILL_FILE}; point --source at the skill's folder")
    front, _ = split_frontmatter(path.read_text(encoding="utf-8"))
    try:
        data = yaml.safe_load(front.text) if front and front.closed else None
    except yaml.YAMLError as exc:
        raise SkillInstallError(f"{path}: the frontmatter is not valid YAML ({exc})") from exc
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > 64:
        raise SkillInstallError(f"{path}: the frontmatter needs a valid `name` (run `ditgate lint`)")
    return name


def skills_dirs(target: Path, layouts: tuple[str, ...]) -> list[Path]:
    """A folder named `skills` is a skills directory; any other folder is a project root."""
    if target.name == "skills":
        return [target]
    unknown = [layout for layout in layouts if layout not in LAYOUTS]
    if unknown:
        raise SkillInstallError(f"unknown layout {unknown[0]!r} (layouts: {', '.join(LAYOUTS)})")
    return [target / LAYOUTS[layout] for layout in dict.fromkeys(layouts)]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _build(source: Path, tmp: Path, link: bool) -> None:
    if link:
        tmp.symlink_to(source, target_is_directory=True)
        return
    tmp.mkdir()
    for part in INSTALLED_PARTS:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, tmp / part, ignore=_IGNORE)
        elif src.is_file():
            shutil.copy2(src, tmp / part)


def _place(source: Path, dest: Path, link: bool) -> None:
    token = uuid.uuid4().hex[:8]
    tmp = dest.with_name(f".{dest.name}.tmp-{token}")
    old = dest.with_name(f".{dest.name}.old-{token}")
    try:
        _build(source, tmp, link)
        replacing = dest.exists() or dest.is_symlink()
        if replacing:
            dest.rename(old)
        try:
            tmp.rename(dest)
        except OSError:
            if replacing:
                old.rename(dest)
            raise
        if replacing:
            _remove(old)
    finally:
        if tmp.exists() or tmp.is_symlink():
            _remove(tmp)


def install_skill(target: str | Path, source: str | Path | None = None, layouts: tuple[str, ...] = ("agents",),
                  link: bool = False, force: bool = False) -> InstallResult:
    """Install the skill at `source` (default: this repository) under `target`; returns where it went."""
    source = Path(source or default_source()).resolve()
    name = skill_name(source)
    stray = stray_links(source)
    if stray:  # a copy would install what a link out of the skill points at; an installed link would point there
        raise SkillInstallError(f"{source}: {stray[0][0]} is {stray[0][1]}" + (f" ({len(stray) - 1} more)" if
                                len(stray) > 1 else "") + "; a skill's links must stay inside it: replace them with "
                                "the files, or remove them (`ditgate lint` lists them)")
    target = Path(target).absolute()
    for folder in (target, *target.parents):
        if folder.exists():
            if not folder.is_dir():
                raise SkillInstallError(f"--target {target}: {folder} is a file, not a folder")
            break
    destinations = [folder / name for folder in skills_dirs(target, layouts)]
    for dest in destinations:
        if (dest.exists() or dest.is_symlink()) and not force:
            raise SkillExistsError(f"{dest} already exists; pass --force to replace it")
        if not dest.is_symlink() and dest.resolve() == source:
            raise SkillInstallError(f"{dest} is the skill's own folder")
        if (dest.exists() or dest.is_symlink()) and not (dest / SKILL_FILE).is_file():
            raise SkillInstallError(f"{dest} exists and is not an installed skill (no {SKILL_FILE}); --force replaces "
                                    "only a skill, so move it away yourself")
    for dest in destinations:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _place(source, dest, link)
        except shutil.Error as exc:
            raise SkillInstallError(f"copying {source} to {dest} failed: {exc}") from None
        except OSError as exc:
            raise SkillInstallError(f"cannot install into {dest.parent}: {exc.strerror or exc}") from None
    parts = tuple(part for part in INSTALLED_PARTS if (source / part).exists())
    return InstallResult(name, source, tuple(destinations), link, parts)
