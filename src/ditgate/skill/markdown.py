"""Read a Markdown file of the skill into the parts the linter checks, with 1-based line numbers.

Built on markdown-it-py (CommonMark plus tables): headings (with their GitHub anchors), links and images, fenced
code blocks, inline code spans and HTML anchors. A leading YAML frontmatter block (between `---` lines) is split
off first and kept as raw text; line numbers always refer to the whole file.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from markdown_it import MarkdownIt

_HTML_ANCHOR = re.compile(r"""<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


@dataclass(frozen=True)
class Link:
    target: str
    line: int
    image: bool = False


@dataclass(frozen=True)
class Fence:
    info: str          # the whole info string, e.g. "bash runnable"
    content: str
    line: int          # line of the first content line

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(word.lower() for word in self.info.split()[1:])


@dataclass(frozen=True)
class CodeSpan:
    text: str
    line: int


@dataclass(frozen=True)
class Heading:
    text: str
    line: int
    level: int


@dataclass
class Frontmatter:
    text: str          # the YAML between the `---` lines
    first_line: int    # file line of the YAML's first line
    closed: bool


@dataclass
class Document:
    path: Path
    rel: str                        # path relative to the skill root, with forward slashes
    text: str
    frontmatter: Frontmatter | None
    headings: list[Heading] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    fences: list[Fence] = field(default_factory=list)
    code_spans: list[CodeSpan] = field(default_factory=list)
    html_anchors: set[str] = field(default_factory=set)

    @cached_property
    def lines(self) -> list[str]:
        return split_lines(self.text)

    def anchors(self) -> set[str]:
        """Every `#fragment` a link into this file may use: GitHub heading slugs and HTML `id`/`name` anchors."""
        return set(heading_slugs([h.text for h in self.headings])) | self.html_anchors


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation and symbols dropped, each space turned into a hyphen.

    Letters, marks and numbers of any script are kept, and so are `-` and `_` (github-slugger's rule).
    """
    kept = (ch for ch in text.strip().lower() if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return "".join(kept).replace(" ", "-")


def heading_slugs(texts: list[str]) -> list[str]:
    """Slugs of headings in document order; repeats get `-1`, `-2`, ... as on GitHub."""
    seen: dict[str, int] = {}
    slugs = []
    for text in texts:
        slug = base = github_slug(text)
        while slug in seen:
            seen[base] += 1
            slug = f"{base}-{seen[base]}"
        seen.setdefault(slug, 0)
        slugs.append(slug)
    return slugs


def split_lines(text: str) -> list[str]:
    """Lines as Markdown counts them (only `\n` ends a line; no empty last line after a final newline)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def split_frontmatter(text: str) -> tuple[Frontmatter | None, int]:
    """The frontmatter block (if the file starts with `---`) and the number of lines it occupies."""
    lines = split_lines(text)
    if not lines or lines[0].rstrip() != "---":
        return None, 0
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            return Frontmatter("\n".join(lines[1:index]), 2, True), index + 1
    return Frontmatter("\n".join(lines[1:]), 2, False), len(lines)


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def parse(path: Path, root: Path) -> Document:
    text = path.read_text(encoding="utf-8")
    frontmatter, skipped = split_frontmatter(text)
    body = "\n".join(split_lines(text)[skipped:])
    doc = Document(path=path, rel=path.relative_to(root).as_posix(), text=text, frontmatter=frontmatter)
    heading_level = 0
    for token in _parser().parse(body):
        first = token.map[0] + skipped + 1 if token.map else 0
        if token.type == "heading_open":
            heading_level = int(token.tag[1:])
        elif token.type == "fence":
            doc.fences.append(Fence(token.info.strip(), token.content, first + 1))
        elif token.type == "html_block":
            doc.html_anchors.update(_HTML_ANCHOR.findall(token.content))
        elif token.type == "inline":
            if heading_level:
                doc.headings.append(Heading(_plain_text(token.children or []), first, heading_level))
                heading_level = 0
            _collect_inline(doc, token.children or [], first)
    return doc


def _plain_text(children) -> str:
    """What GitHub slugs: the rendered text of a heading (code spans keep their text, markup is dropped)."""
    return "".join(c.content for c in children if c.type in ("text", "code_inline"))


def _collect_inline(doc: Document, children, line: int) -> None:
    for child in children:
        if child.type in ("softbreak", "hardbreak"):
            line += 1
        elif child.type == "link_open":
            doc.links.append(Link(str(child.attrs.get("href", "")), line))
        elif child.type == "image":
            doc.links.append(Link(str(child.attrs.get("src", "")), line, image=True))
        elif child.type == "code_inline":
            doc.code_spans.append(CodeSpan(child.content, line))
        elif child.type == "html_inline":
            doc.html_anchors.update(_HTML_ANCHOR.findall(child.content))
