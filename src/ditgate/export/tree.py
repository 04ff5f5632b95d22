"""The cache-dit tree an export writes into: a folder holding the `cache_dit` package (a checkout's `src/`, or a
copy of the installed package's parent), what it already registers, and the edits applied all at once.

An edit of an existing file is a block at a fixed place; a file that already holds the very block is left as it is
(exporting twice writes nothing the second time). A tree that registers the prefix otherwise, or a prefix that
already matches the model's classes, is refused: cache-dit matches class names by prefix in registration order, so
the earlier entry would win and the exported code would never run.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ditgate.core.errors import DitgateError

ADAPTERS = "cache_dit/caching/block_adapters/adapters.py"
ADAPTERS_INIT = "cache_dit/caching/block_adapters/__init__.py"
PLANNERS = "cache_dit/distributed/transformers/planners.py"
EXAMPLES = "cache_dit/_utils/examples.py"
_REGISTER = re.compile(r'(BlockAdapterRegister|ContextParallelismPlannerRegister|TensorParallelismPlannerRegister'
                       r'|ExampleRegister)\.register\(\s*"([^"]+)"')


class ExportError(DitgateError):
    """The tree cannot take the export (not a cache-dit tree, read-only, the name taken)."""


@dataclass
class Tree:
    root: Path
    files: dict[str, str | bytes] = field(default_factory=dict)  # relative path -> new content (text or bytes)

    @classmethod
    def open(cls, root: str | Path) -> "Tree":
        root = Path(root).absolute()
        if not (root / "cache_dit" / "__init__.py").is_file():
            raise ExportError(f"{root} holds no cache_dit package (give the folder that holds it: a checkout's src/ "
                              "or a copy of site-packages' cache_dit's parent)")
        for rel in (ADAPTERS, ADAPTERS_INIT, PLANNERS, EXAMPLES):
            if not (root / rel).is_file():
                raise ExportError(f"{root}: {rel} is missing (cache-dit 1.5.x layout expected)")
        for path in [root / "cache_dit", *(root / "cache_dit").rglob("*")]:  # the export writes only inside the tree
            if path.is_symlink():
                raise ExportError(f"{path} is a symbolic link (to {os.readlink(path)}): the export would write where "
                                  "it points (an installed cache-dit, another tree); export into a tree of real files")
        return cls(root=root)

    def version(self) -> str:
        match = re.search(r"version\s*[:=]\s*[\w\[\], ]*['\"]([^'\"]+)['\"]",
                          (self.root / "cache_dit" / "_version.py").read_text()) \
            if (self.root / "cache_dit" / "_version.py").is_file() else None
        return match.group(1) if match else "unknown"

    def current(self, rel: str) -> str | None:
        if rel in self.files:
            return self.files[rel]
        path = self.root / rel
        return path.read_text() if path.is_file() else None

    def holds(self, rel: str, data: str | bytes) -> bool:
        """Does the tree (with the pending edits) hold exactly `data` at `rel`, or nothing there?"""
        old = self.files[rel] if rel in self.files else _read(self.root / rel, data)
        return old is None or old == data

    def registrations(self, skip: dict[str, str]) -> list[tuple[str, str, str]]:
        """(register, key, file) of every registration in the package, the text of `skip` (file -> exact block the
        export would write) left out."""
        found = []
        for path in sorted((self.root / "cache_dit").rglob("*.py")):
            rel = str(path.relative_to(self.root))
            text = path.read_text(errors="replace")
            if rel in skip and skip[rel]:
                text = text.replace(skip[rel], "")
            found += [(m.group(1), m.group(2), rel) for m in _REGISTER.finditer(text)]
        return found

    # -- edits ---------------------------------------------------------------------------------------------------
    def new_file(self, rel: str, text: str) -> None:
        old = self.current(rel)
        if old is not None and old != text:
            raise ExportError(f"{self.root / rel} exists with other content: the tree already holds this model")
        self.files[rel] = text

    def append(self, rel: str, block: str) -> None:
        text = self.current(rel)
        if block in text:
            self.files[rel] = text
            return
        self.files[rel] = text.rstrip("\n") + "\n\n\n" + block.rstrip("\n") + "\n"

    def insert_before(self, rel: str, block: str, anchors: list[str]) -> None:
        """Put `block` before the first line that starts with one of `anchors` (its comment lines above it
        included), or at the end of the file when there is none."""
        text = self.current(rel)
        if block in text:
            self.files[rel] = text
            return
        rows = text.split("\n")
        at = next((i for i, row in enumerate(rows) if any(row.startswith(a) for a in anchors)), None)
        if at is None:
            self.append(rel, block)
            return
        while at > 0 and rows[at - 1].startswith("#"):
            at -= 1
        rows[at:at] = block.rstrip("\n").split("\n") + ["", ""]
        self.files[rel] = "\n".join(rows)

    def insert_in_function(self, rel: str, function: str, lines: list[str], before_try: bool = False,
                           before_modules: list[str] = ()) -> None:
        """Insert `lines` at the end of a top-level function's body: before its first `try:` with `before_try`,
        before the first statement that imports one of `before_modules` (`_safe_import(".flux", ...)`)."""
        text = self.current(rel)
        block = "\n".join(lines) + "\n"
        if block in text:
            self.files[rel] = text
            return
        node = next((n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function), None)
        if node is None:
            raise ExportError(f"{self.root / rel} has no function {function} (cache-dit 1.5.x layout expected)")
        at = node.end_lineno
        first = next((n for n in node.body if any(f'".{m}"' in ast.get_source_segment(text, n) or ""
                                                   for m in before_modules)), None) if before_modules else None
        if first is not None:
            rows = text.split("\n")
            rows[first.lineno - 1:first.lineno - 1] = block.rstrip("\n").split("\n")
            self.files[rel] = "\n".join(rows)
            return
        if before_try:
            tries = [n for n in node.body if isinstance(n, ast.Try)]
            if tries:
                at = tries[0].lineno - 1
                while at > node.lineno and not text.split("\n")[at - 1].strip():
                    at -= 1
        rows = text.split("\n")
        rows[at:at] = block.rstrip("\n").split("\n")
        self.files[rel] = "\n".join(rows)

    def changed(self) -> dict[str, str | bytes]:
        """The files whose content the export changes (relative path -> new content)."""
        return {rel: data for rel, data in self.files.items() if _read(self.root / rel, data) != data}

    def patch(self) -> str:
        """Every file the export writes, as a `git diff`-style patch (paths a/ and b/ relative to the tree)."""
        chunks = []
        for rel, data in sorted(self.changed().items()):
            chunks.append(_diff(rel, _read(self.root / rel, data), data))
        return "".join(chunks)

    def check_root_writable(self) -> None:
        """Refuse early (before any model is loaded) a tree this process cannot write into."""
        for folder in (self.root / "cache_dit", self.root):
            if not os.access(folder, os.W_OK):
                raise ExportError(f"{self.root} is not writable")

    def check_writable(self) -> None:
        for rel in self.changed():
            target = self.root / rel
            folder = next(p for p in [target.parent, *target.parents] if p.exists())
            if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
                raise ExportError(f"{self.root} is not writable ({rel})")

    def write(self) -> list[str]:
        """Write every changed file: each to a temporary name beside it first, then all renamed; on a failure the
        files already renamed are put back. Returns the relative paths written."""
        changed = self.changed()
        self.check_writable()
        staged: list[tuple[Path, Path, str | None]] = []
        try:
            for rel, data in changed.items():
                target = self.root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data.encode() if isinstance(data, str) else data)
                os.chmod(tmp, 0o644)
                staged.append((Path(tmp), target, target.read_bytes() if target.is_file() else None))
        except OSError as exc:
            for tmp, _, _ in staged:
                tmp.unlink(missing_ok=True)
            raise ExportError(f"{self.root} is not writable: {exc.strerror or exc}") from exc
        done = []
        try:
            for tmp, target, _ in staged:
                os.replace(tmp, target)
                done.append(target)
        except OSError as exc:
            for tmp, target, old in staged:
                tmp.unlink(missing_ok=True)
                if target in done:
                    target.write_bytes(old) if old is not None else target.unlink()
            raise ExportError(f"writing {self.root} failed: {exc}") from exc
        return sorted(changed)


def _read(path: Path, like: str | bytes) -> str | bytes | None:
    """The file's content as text or bytes, like `like`; None when it does not exist."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if isinstance(like, bytes):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _diff(rel: str, old: str | bytes | None, new: str | bytes) -> str:
    head = f"diff --git a/{rel} b/{rel}\n" + ("new file mode 100644\n" if old is None else "")
    if isinstance(new, bytes) or isinstance(old, bytes):
        return head + f"Binary files {'/dev/null' if old is None else 'a/' + rel} and b/{rel} differ\n"
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    body = "".join(difflib.unified_diff(a, b, fromfile="/dev/null" if old is None else f"a/{rel}",
                                        tofile=f"b/{rel}", n=3))
    return head + body
