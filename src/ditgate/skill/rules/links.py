"""Rules about the skill's files and how they point at each other: links, anchors, routes, reachability,
nesting, portability of links once installed, and the files every phase must have."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ditgate.skill.base import INSTALLED_PARTS, REFERENCES, SKILL_FILE, Problem, Skill, stray_links
from ditgate.skill.rules.commandlines import RUNNABLE, SHELL_FENCES, command_words, logical_lines
from ditgate.skill.markdown import Document, parse
from ditgate.skill.rules.phases import PHASES

_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
# A path to one of the skill's folders written in text or code: `references/cp.md`, ./checklists/gates.json,
# "$SKILL_DIR/examples/recipes/mask_reorder.py".
_MENTION = re.compile(r"(?:(?<![\w/.$-])|(?<=\$SKILL_DIR/)|(?<=\$\{SKILL_DIR\}/))(?:\./)?"
                      r"((?:references|checklists|notebooks|examples)/[\w./-]*\w)")
# A command word that is a path inside the skill: `examples/x.py` (relative: runs only from the skill's folder) or
# `$SKILL_DIR/x/y` (runs from anywhere, but only if x is a part an installation holds).
_SKILL_DIR = re.compile(r"^(?:\$SKILL_DIR|\$\{SKILL_DIR\})/(.+)$")
_LINK_PREFIX = re.compile(r"(?:\]\(\s*<?|^\s*\[[^\]]+\]:\s*<?)$")
_LINE_FRAGMENT = re.compile(r"^L\d+(?:-L?\d+)?$")


@dataclass(frozen=True)
class Target:
    """Something a file points at: a Markdown link, or a path to a skill folder written in the text."""

    doc: Document
    line: int
    raw: str
    rel: str | None        # resolved path relative to the skill root; None when it leaves the root
    fragment: str = ""
    absolute: bool = False

    @property
    def depth(self) -> int:
        """Folders below references/ (references/x.md -> 0, references/a/x.md -> 1)."""
        if self.rel is None or not self.rel.startswith(REFERENCES + "/"):
            return 0
        return self.rel.count("/") - 1


def _relative(root: Path, path: Path) -> str | None:
    try:
        return Path(os.path.normpath(path)).relative_to(root).as_posix()
    except ValueError:
        return None


def link_targets(skill: Skill, doc: Document) -> Iterator[Target]:
    for link in doc.links:
        target = link.target.strip()
        if not target or _EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        path, fragment = unquote(path), unquote(fragment)
        if path.startswith("/"):
            yield Target(doc, link.line, target, None, fragment, absolute=True)
            continue
        rel = _relative(skill.root, doc.path.parent / path) if path else doc.rel
        yield Target(doc, link.line, target, rel, fragment)


def mentions(skill: Skill, doc: Document) -> Iterator[Target]:
    """File paths such as `references/cp.md` written in text, code spans or fences (links excluded)."""
    for number, line in enumerate(doc.lines, start=1):
        for match in _MENTION.finditer(line):
            if _LINK_PREFIX.search(line[: match.start()]):
                continue
            path = match.group(1)
            if not Path(path).suffix or Path(path).stem.isupper():   # a folder, or a placeholder (PHASE.yaml)
                continue
            rel = _relative(skill.root, skill.root / path)
            if rel is not None and not skill.exists(rel):
                beside = _relative(skill.root, doc.path.parent / path)
                rel = beside if beside is not None and skill.exists(beside) else rel
            yield Target(doc, number, path, rel)


def _all_targets(skill: Skill) -> Iterator[Target]:
    for doc in skill.docs.values():
        yield from link_targets(skill, doc)
        yield from mentions(skill, doc)


def check_links(skill: Skill) -> Iterator[Problem]:
    for doc in skill.docs.values():
        for target in link_targets(skill, doc):
            if target.rel is not None and not skill.exists(target.rel):
                yield Problem(doc.rel, target.line, f"link to `{target.raw}`: {target.rel} does not exist")


def check_portable(skill: Skill) -> Iterator[Problem]:
    yield from check_fence_paths(skill)
    for doc in skill.docs.values():
        for target in link_targets(skill, doc):
            if target.absolute:
                yield Problem(doc.rel, target.line, f"link to `{target.raw}` is an absolute path; use a path"
                                                    f" relative to the file")
            elif target.rel is None or target.rel.split("/")[0] not in INSTALLED_PARTS:
                where = "outside the skill root" if target.rel is None else target.rel
                yield Problem(doc.rel, target.line,
                              f"link to `{target.raw}` leaves the installed skill ({where}); an installed copy"
                              f" holds only {', '.join(INSTALLED_PARTS)}")


def _fence_path_problem(word: str) -> str | None:
    match = _SKILL_DIR.match(word)
    if match:
        part = match.group(1).split("/")[0]
        if part not in INSTALLED_PARTS:
            return (f"`{word}` is not in an installed copy, which holds only {', '.join(INSTALLED_PARTS)}")
        return None
    path = word[2:] if word.startswith("./") else word
    if "/" in path and path.split("/")[0] in INSTALLED_PARTS and not path.startswith(("/", "$", "~")):
        return (f"`{word}` is relative to the skill's folder, so the fence runs only from there; write"
                f" \"$SKILL_DIR/{path}\"")
    return None


def check_fence_paths(skill: Skill) -> Iterator[Problem]:
    """`bash runnable` fences run from any folder: paths of the skill are written under `$SKILL_DIR`."""
    for doc in skill.docs.values():
        for fence in doc.fences:
            if fence.language not in SHELL_FENCES or RUNNABLE not in fence.flags:
                continue
            for offset, line in logical_lines(fence.content):
                try:
                    commands = command_words(line)
                except ValueError:
                    continue
                for word in (w for words in commands for w in words):
                    for value in [word, *word.split("=", 1)[1:]]:          # --integration=examples/x.py
                        problem = _fence_path_problem(value)
                        if problem:
                            yield Problem(doc.rel, fence.line + offset, problem)


def check_anchors(skill: Skill) -> Iterator[Problem]:
    parsed: dict[str, Document] = dict(skill.docs)
    for doc in skill.docs.values():
        for target in link_targets(skill, doc):
            if not target.fragment or target.rel is None or not target.rel.endswith(".md"):
                continue
            if not skill.exists(target.rel) or _LINE_FRAGMENT.match(target.fragment):
                continue
            if target.rel not in parsed:
                parsed[target.rel] = parse(skill.root / target.rel, skill.root)
            anchors = {a.lower() for a in parsed[target.rel].anchors()}
            if target.fragment.lower() not in anchors:
                yield Problem(doc.rel, target.line,
                              f"anchor `#{target.fragment}` is not a heading of {target.rel}")


def check_nesting(skill: Skill) -> Iterator[Problem]:
    reported: set[tuple[str, int, str]] = set()
    for target in _all_targets(skill):
        key = (target.doc.rel, target.line, target.rel or "")
        if target.depth > 0 and key not in reported:
            reported.add(key)
            yield Problem(target.doc.rel, target.line, f"`{target.raw}` is nested below references/; references"
                                                       f" must be one level deep (references/NAME.md)")
    folder = skill.root / REFERENCES
    if folder.is_dir():
        for path in sorted(folder.glob("*/**/*")):
            if path.is_file():
                yield Problem(path.relative_to(skill.root).as_posix(), 1,
                              "file nested below references/; references must be one level deep")


def check_routes(skill: Skill) -> Iterator[Problem]:
    for doc in skill.docs.values():
        for target in mentions(skill, doc):
            if target.rel is None or not skill.exists(target.rel):
                yield Problem(doc.rel, target.line, f"`{target.raw}` is named here but does not exist")


def _reached_from_skill_md(skill: Skill) -> dict[str, int]:
    """Skill-root paths SKILL.md links to or names, with the first line where it does."""
    doc = skill.skill_md
    reached: dict[str, int] = {}
    if doc is not None:
        for target in [*link_targets(skill, doc), *mentions(skill, doc)]:
            if target.rel is not None:
                reached.setdefault(target.rel, target.line)
    return reached


def check_unreachable(skill: Skill) -> Iterator[Problem]:
    if skill.skill_md is None:
        return
    reached = _reached_from_skill_md(skill)
    for ref in skill.references:
        if ref.rel not in reached:
            yield Problem(ref.rel, 1, "no route and no \"read X when Y\" line in SKILL.md reaches this reference")


def check_file_links(skill: Skill) -> Iterator[Problem]:
    """Files of the installed parts that are links out of the skill or broken links: `skill install` refuses them
    (a copy would install what they point at)."""
    for rel, why in stray_links(skill.root):
        yield Problem(rel, 1, f"{rel} is {why}; an installed copy cannot keep it: put the file itself there, or "
                              "remove it")


def check_phase_files(skill: Skill) -> Iterator[Problem]:
    reached = _reached_from_skill_md(skill)
    for phase in PHASES:
        line = reached.get(phase.reference, 1)
        for kind, rel in phase.files.items():
            if not skill.exists(rel):
                yield Problem(SKILL_FILE, line, f"phase {phase.key} has no {kind} ({rel} is missing)")
