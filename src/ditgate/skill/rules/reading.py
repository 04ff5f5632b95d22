"""The `reading` rule: each route of SKILL.md reaches its first gated row after a short read.

SKILL.md's route table (the table whose header has a "Read first" column) says, per route, which pages to read
before the "Run first" command. The lines an agent reads on a route are all of SKILL.md plus each page the route's
"Read first" cell links to: the whole file, or only the linked section (from its heading to the next heading of the
same or a higher level) when the link has an anchor; a cell that says "route N" adds route N's pages. A route over
`READING_BUDGET` lines is an error; `reading_paths` gives the count of every route (`ditgate lint` prints them).
A skill without a route table has no routes to count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ditgate.skill.base import SKILL_FILE, Problem, Skill
from ditgate.skill.rules.links import Target, link_targets
from ditgate.skill.markdown import Document, heading_slugs, parse

# Lines read before the first gated row, on any route (issue "skill depth": at most about 600; an agent that read
# about 4,800 lines of the installed skill before its first command is what this prevents).
READING_BUDGET = 600
READ_FIRST = "read first"
_ROUTE_REF = re.compile(r"\broute (\d+)\b", re.IGNORECASE)


@dataclass
class Route:
    number: str
    line: int                                         # the route's row in SKILL.md
    pages: dict[str, int] = field(default_factory=dict)   # "references/x.md#anchor" -> lines read there

    @property
    def lines(self) -> int:
        return sum(self.pages.values())

    def describe(self) -> str:
        parts = ", ".join(f"{page} {count}" for page, count in self.pages.items())
        return f"route {self.number}: {self.lines} lines ({parts})"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table(doc: Document) -> tuple[int, list[tuple[int, list[str]]]] | None:
    """The route table: the index of its "Read first" column and its body rows (line, cells)."""
    lines = doc.lines
    for number, line in enumerate(lines, start=1):
        cells = _cells(line) if line.lstrip().startswith("|") else []
        headers = [cell.lower() for cell in cells]
        if READ_FIRST in headers:
            rows = []
            for offset, row in enumerate(lines[number + 1:], start=number + 2):      # skip the |---| line
                if not row.lstrip().startswith("|"):
                    break
                rows.append((offset, _cells(row)))
            return headers.index(READ_FIRST), rows
    return None


def _section_lines(doc: Document, fragment: str) -> int | None:
    """Lines of the section a `#fragment` names (heading to the next heading of the same or higher level)."""
    slugs = heading_slugs([h.text for h in doc.headings])
    for index, (heading, slug) in enumerate(zip(doc.headings, slugs)):
        if slug == fragment.lower():
            end = next((h.line for h in doc.headings[index + 1:] if h.level <= heading.level), len(doc.lines) + 1)
            return end - heading.line
    return None


def _pages(skill: Skill, targets: list[Target]) -> Iterator[tuple[str, int]]:
    for target in targets:
        if target.rel is None or target.rel == SKILL_FILE or not target.rel.endswith(".md"):
            continue                                  # SKILL.md is counted once, whole
        if not skill.exists(target.rel):
            continue                                  # the `link` rule reports it
        page = skill.docs.get(target.rel) or parse(skill.root / target.rel, skill.root)
        count = _section_lines(page, target.fragment) if target.fragment else None
        name = f"{target.rel}#{target.fragment}" if count is not None else target.rel
        yield name, count if count is not None else len(page.lines)


def _in_cell(target: Target, cell: str) -> bool:
    return f"]({target.raw})" in cell or f"](<{target.raw}>)" in cell


def reading_paths(skill: Skill) -> list[Route]:
    doc = skill.skill_md
    found = _table(doc) if doc is not None else None
    if found is None:
        return []
    column, rows = found
    targets = list(link_targets(skill, doc))
    routes: dict[str, Route] = {}
    cells: dict[str, str] = {}
    for line, row in rows:
        if len(row) <= column:
            continue
        number = row[0].strip() or str(len(routes) + 1)
        route = Route(number, line, {SKILL_FILE: len(doc.lines)})
        route.pages.update(_pages(skill, [t for t in targets if t.line == line and _in_cell(t, row[column])]))
        routes[number], cells[number] = route, row[column]
    for number, route in routes.items():             # "then route 2": that route's pages too
        seen = {number}
        pending = _ROUTE_REF.findall(cells[number])
        while pending:
            other = pending.pop()
            if other in seen or other not in routes:
                continue
            seen.add(other)
            for page, count in routes[other].pages.items():
                route.pages.setdefault(page, count)
            pending += _ROUTE_REF.findall(cells[other])
    return list(routes.values())


def check_reading(skill: Skill) -> Iterator[Problem]:
    for route in reading_paths(skill):
        if route.lines > READING_BUDGET:
            yield Problem(SKILL_FILE, route.line, f"{route.describe()} before its first gated row; the budget is"
                                                  f" {READING_BUDGET}")
