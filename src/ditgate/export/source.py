"""An integration file read as source: its top-level pieces, what each hook needs, and that code re-emitted in
cache-dit's style (two-space indents), comments kept.

`Source.read(path)` parses the file; `needed(roots)` is the closure of the top-level definitions the roots use (a
name used inside a function counts: it is looked up in the module at call time); `text(names)` is those pieces in
file order with the imports they use, each import cut down to the names used.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from ditgate.core.errors import DitgateError

DITGATE_ONLY = ("CP_SPLIT_DIMS",)  # what only ditgate's proof reads; it does not move into cache-dit


@dataclass
class Piece:
    """One top-level statement: a definition, an assignment or an import."""
    node: ast.stmt
    text: str  # its source with the comment lines right above it
    defines: set[str]  # names it binds
    uses: set[str]  # names it reads


@dataclass
class Source:
    path: Path
    lines: list[str]
    pieces: list[Piece] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)  # top-level statements that are not definitions

    @classmethod
    def read(cls, path: str | Path) -> "Source":
        path = Path(path)
        text = path.read_text()
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            raise DitgateError(f"{path}: cannot parse the integration file: {exc}") from exc
        source = cls(path=path, lines=text.splitlines())
        for node in tree.body:
            if _is_docstring(node):
                continue
            if not isinstance(node, _MOVABLE):
                source.statements.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0][:80]}")
                continue
            source.pieces.append(Piece(node, source._segment(node), _defines(node), _uses(node)))
        return source

    def _segment(self, node: ast.stmt) -> str:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        start = first - 1
        while start > 0 and self.lines[start - 1].lstrip().startswith("#") and not self.lines[start - 1].startswith(
                "# --"):
            start -= 1
        return "\n".join(self.lines[start:node.end_lineno])

    def only(self, hooks: set[str]) -> "Source":
        """The same file with the hooks not in `hooks` left out (block_adapter, cp_plan, tp_plan)."""
        dropped = {"block_adapter", "cp_plan", "tp_plan"} - set(hooks)
        kept = [p for p in self.pieces if not (p.defines & dropped and not _is_import(p.node))]
        return Source(path=self.path, lines=self.lines, pieces=kept, statements=self.statements)

    def function(self, name: str) -> ast.FunctionDef | None:
        for piece in self.pieces:
            if isinstance(piece.node, ast.FunctionDef) and piece.node.name == name:
                return piece.node
        return None

    def defined(self) -> set[str]:
        return set().union(*(p.defines for p in self.pieces if not _is_import(p.node)))

    def needed(self, roots: list[str], exclude: set[str] = frozenset()) -> list[str]:
        """Every top-level definition the roots reach (the roots included), in file order."""
        owners = {name: p for p in self.pieces if not _is_import(p.node) for name in p.defines}
        seen: set[int] = set()
        todo = [owners[r] for r in roots if r in owners]
        while todo:
            piece = todo.pop()
            if id(piece) in seen or piece.defines & set(exclude):
                continue
            seen.add(id(piece))
            todo += [owners[n] for n in piece.uses if n in owners]
        return [name for p in self.pieces if id(p) in seen for name in sorted(p.defines)]

    def imports_for(self, names: set[str]) -> list[str]:
        """The file's import statements cut to the names `names` use (`from __future__` kept first)."""
        out = []
        for piece in self.pieces:
            node = piece.node
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if not _is_import(node):
                continue
            kept = [a for a in node.names if (a.asname or a.name).split(".")[0] in names]
            if not kept:
                continue
            if isinstance(node, ast.ImportFrom):
                out.append(ast.unparse(ast.ImportFrom(module=node.module, names=kept, level=node.level)))
            else:
                out.append(ast.unparse(ast.Import(names=kept)))
        return out

    def uses_of(self, definitions: list[str]) -> set[str]:
        return set().union(set(), *(p.uses for p in self.pieces if p.defines & set(definitions)))

    def text(self, definitions: list[str]) -> str:
        """The pieces defining these names, in file order, blank-line separated."""
        wanted = set(definitions)
        chunks = [p.text for p in self.pieces if not _is_import(p.node) and p.defines & wanted]
        return "\n\n\n".join(chunks)


# what moves into cache-dit: definitions, assignments, imports (a statement run at import, a call or an `if`, does not)
_MOVABLE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Import,
            ast.ImportFrom)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_import(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if _is_import(node):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    names = set()
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    for target in targets:
        if target is not None:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _uses(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def two_space(code: str) -> str:
    """Halve the indentation of every line that does not start inside a multi-line string (cache-dit indents by
    two). The result is compiled; where it would not compile the code is returned as it was."""
    inside: set[int] = set()  # lines that begin inside a string token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError):
        return code
    out = []
    for number, line in enumerate(code.split("\n"), start=1):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        out.append(line if number in inside or not body else " " * (indent // 2) + " " * (indent % 2) + body)
    result = "\n".join(out)
    try:
        compile(result, "<export>", "exec")
    except SyntaxError:
        return code
    return result
