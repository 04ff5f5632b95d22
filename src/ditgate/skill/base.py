"""What every lint rule works on: the skill folder, its parsed Markdown files, and the problems rules report."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ditgate.core.errors import DitgateError
from ditgate.core.paths import DATA_PARTS, PACKAGED
from ditgate.skill.markdown import Document, parse

SKILL_FILE = "SKILL.md"
REFERENCES = "references"
# What a skill installation holds (see `ditgate.skill.install`). Links are copied as they are, so every relative
# link of the skill must stay inside these parts.
INSTALLED_PARTS: tuple[str, ...] = DATA_PARTS


class SkillRootError(DitgateError, FileNotFoundError):
    """The skill root to lint or install from does not exist or is not a folder."""


@dataclass(frozen=True)
class Problem:
    """One problem a rule found; the linter adds the rule's id and severity."""

    file: str
    line: int
    message: str
    warning: bool = False


@dataclass
class Skill:
    root: Path
    docs: dict[str, Document] = field(default_factory=dict)   # SKILL.md and references/**/*.md, by relative path

    @property
    def skill_md(self) -> Document | None:
        return self.docs.get(SKILL_FILE)

    @property
    def references(self) -> list[Document]:
        return [doc for rel, doc in self.docs.items() if rel.startswith(REFERENCES + "/")]

    @property
    def is_source_tree(self) -> bool:
        """A project checkout (the skill lives at its root) or the copy an installed ditgate ships, rather than an
        installed skill folder."""
        return (self.root / "pyproject.toml").exists() or (self.root / ".git").exists() or \
            self.root.resolve() == PACKAGED

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()


def stray_links(root: Path) -> list[tuple[str, str]]:
    """Symbolic links in the installed parts of the skill at `root` that a copy could not keep: (relative path,
    why) for a link whose target does not exist, and for one pointing outside the skill (copying it would install
    what it points at, `references/x.md -> /etc/passwd`)."""
    root = Path(root).resolve()
    found = []
    for part in INSTALLED_PARTS:
        top = root / part
        paths = [top, *top.rglob("*")] if top.is_dir() and not top.is_symlink() else [top]
        for path in paths:
            if not path.is_symlink():
                continue
            rel, target = path.relative_to(root).as_posix(), os.readlink(path)
            if not path.exists():
                found.append((rel, f"a broken link (to {target})"))
            elif not path.resolve().is_relative_to(root):
                found.append((rel, f"a link out of the skill (to {target})"))
    return found


def load_skill(root: str | Path) -> Skill:
    root = Path(root).resolve()
    if not root.is_dir():
        raise SkillRootError(f"skill root {root} does not exist or is not a folder")
    skill = Skill(root)
    paths = [root / SKILL_FILE] if (root / SKILL_FILE).is_file() else []
    paths += sorted((root / REFERENCES).rglob("*.md")) if (root / REFERENCES).is_dir() else []
    for path in paths:
        if not path.is_file() or not path.resolve().is_relative_to(root):  # a link out of it is never read
            continue
        try:
            doc = parse(path, root)
        except UnicodeDecodeError as exc:
            raise SkillRootError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        skill.docs[doc.rel] = doc
    return skill
