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
_REGISTER = re.compile(r'(BlockAdapterRegister|ContextParallelismPlannerRegister|TensorParallelismPlannerRegister)'
                       r'\.register\(\s*"([^"]+)"')


class ExportError(DitgateError):
    """The tree cannot take the export (not a cache-dit tree, read-only, the name taken)."""


@dataclass
class Tree:
    root: Path
    files: dict[str, str] = field(default_factory=dict)  # relative path -> new text (what the export writes)

    @classmethod
    def open(cls, root: str | Path) -> "Tree":
        root = Path(root).absolute()
        if not (root / "cache_dit" / "__init__.py").is_file():
            raise ExportError(f"{root} holds no cache_dit package (give the folder that holds it: a checkout's src/ "
                              "or a copy of site-packages' cache_dit's parent)")
        for rel in (ADAPTERS, ADAPTERS_INIT, PLANNERS, EXAMPLES):
            if not (root / rel).is_file():
                raise ExportError(f"{root}: {rel} is missing (cache-dit 1.5.x layout expected)")
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

    def insert_in_function(self, rel: str, function: str, lines: list[str], before_try: bool = False) -> None:
        """Insert `lines` at the end of a top-level function's body (before its first `try:` with `before_try`)."""
        text = self.current(rel)
        block = "\n".join(lines) + "\n"
        if block in text:
            self.files[rel] = text
            return
        node = next((n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function), None)
        if node is None:
            raise ExportError(f"{self.root / rel} has no function {function} (cache-dit 1.5.x layout expected)")
        at = node.end_lineno
        if before_try:
            tries = [n for n in node.body if isinstance(n, ast.Try)]
            if tries:
                at = tries[0].lineno - 1
                while at > node.lineno and not text.split("\n")[at - 1].strip():
                    at -= 1
        rows = text.split("\n")
        rows[at:at] = block.rstrip("\n").split("\n")
        self.files[rel] = "\n".join(rows)

    def changed(self) -> dict[str, str]:
        """The files whose text the export changes (relative path -> new text)."""
        out = {}
        for rel, text in self.files.items():
            path = self.root / rel
            if not path.is_file() or path.read_text() != text:
                out[rel] = text
        return out

    def patch(self) -> str:
        """Every file the export writes, as a `git diff`-style patch (paths a/ and b/ relative to the tree)."""
        chunks = []
        for rel, text in sorted(self.files.items()):
            path = self.root / rel
            old = path.read_text() if path.is_file() else None
            if old == text:
                continue
            chunks.append(_diff(rel, old, text))
        return "".join(chunks)

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
            for rel, text in changed.items():
                target = self.root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
                os.chmod(tmp, 0o644)
                staged.append((Path(tmp), target, target.read_text() if target.is_file() else None))
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
                    target.write_text(old) if old is not None else target.unlink()
            raise ExportError(f"writing {self.root} failed: {exc}") from exc
        return sorted(changed)


def _diff(rel: str, old: str | None, new: str) -> str:
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    head = f"diff --git a/{rel} b/{rel}\n" + ("new file mode 100644\n" if old is None else "")
    body = "".join(difflib.unified_diff(a, b, fromfile="/dev/null" if old is None else f"a/{rel}",
                                        tofile=f"b/{rel}", n=3))
    return head + body
