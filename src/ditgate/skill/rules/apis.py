"""The `api` rule: names of cache-dit and diffusers that the skill uses must exist in the installed versions.

Checked: in Python fences (```python) every `import` / `from ... import` of `cache_dit` or `diffusers`, every dotted
name built on such an import (`cache_dit.enable_cache`, `ForwardPattern.Pattern_1` after
`from cache_dit import ForwardPattern`), and the keyword arguments of calls to them (when the callee takes no
`**kwargs`); in inline code spans the same, with the imports of the file's Python fences in scope. Names are
resolved by importing the module and `getattr`. Text that is not code is never checked, and neither are
placeholder names (`MyModelPipeline`, `YourDiT`, `transformer_xxx`). String values and cache-dit's command
lines are checked too (`ditgate.skill.rules.values`), and class names written alone in a code span
(`ditgate.skill.rules.classnames`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ditgate.skill.base import Problem, Skill
from ditgate.skill.rules.classnames import check_class_names
from ditgate.skill.markdown import Document
from ditgate.skill.rules.values import check_generate_commands, wrong_assignments, wrong_keyword_values

ROOTS = ("cache_dit", "diffusers")
PYTHON_FENCES = ("python", "py", "python3")
_DOTTED = re.compile(r"(?<![\w./-])((?:cache_dit|diffusers)(?:\.[A-Za-z_]\w*)+)")
# Example names that stand for the reader's own model are not looked up: MyModelPipeline, YourDiT, transformer_xxx.
_PLACEHOLDER = re.compile(r"(?:^|[._])(?:My|Your)[A-Z0-9_]|xxx|XXX|Xxx")
_FROM_IMPORT = re.compile(r"^\s*from\s+((?:cache_dit|diffusers)[\w.]*)\s+import\s+\(?([\w\s,]+)\)?\s*$")


@dataclass(frozen=True)
class Resolution:
    obj: Any = None
    error: str | None = None
    warning: bool = False     # the name could not be checked (an import failed for another reason)


def _is_root(dotted: str) -> bool:
    return dotted.split(".")[0] in ROOTS


def _declared(cls: type, name: str) -> bool:
    """An instance attribute: annotated on the class (dataclass fields), a parameter of an `__init__` (pipeline
    components, model config), or set as `self.NAME` in an `__init__`."""
    assignment = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=]+)?=[^=]")
    for klass in inspect.getmro(cls):
        if name in vars(klass).get("__annotations__", {}):
            return True
        init = vars(klass).get("__init__")
        if init is None:
            continue
        try:
            if name in inspect.signature(init).parameters or assignment.search(inspect.getsource(init)):
                return True
        except (OSError, TypeError, ValueError):
            continue
    return False


@dataclass
class Resolver:
    """Resolves dotted names by import and getattr, remembering every answer."""

    cache: dict[str, Resolution] = field(default_factory=dict)

    def resolve(self, dotted: str) -> Resolution:
        if _PLACEHOLDER.search(dotted):
            return Resolution()
        if dotted not in self.cache:
            self.cache[dotted] = self._resolve(dotted)
        return self.cache[dotted]

    def _resolve(self, dotted: str) -> Resolution:
        parts = dotted.split(".")
        try:
            obj = importlib.import_module(parts[0])
        except Exception as exc:  # noqa: BLE001 - any failure means the name cannot be checked here
            return Resolution(error=f"cannot check `{dotted}`: {parts[0]} cannot be imported ({exc})", warning=True)
        path = parts[0]
        for part in parts[1:]:
            try:
                found, value = True, getattr(obj, part)
            except Exception:  # noqa: BLE001 - lazy modules raise all sorts of errors on a missing name
                found, value = False, None
            if not found and inspect.ismodule(obj):
                try:
                    found, value = True, importlib.import_module(f"{path}.{part}")
                except ModuleNotFoundError as exc:
                    if exc.name and not f"{path}.{part}".startswith(exc.name):
                        return Resolution(error=f"cannot check `{dotted}`: importing {path}.{part} needs"
                                                f" {exc.name}", warning=True)
                except Exception as exc:  # noqa: BLE001
                    return Resolution(error=f"cannot check `{dotted}`: importing {path}.{part} failed ({exc})",
                                      warning=True)
            if not found:
                if inspect.isclass(obj) and _declared(obj, part):
                    return Resolution()      # an instance field: exists, nothing further to resolve
                return Resolution(error=f"`{dotted}`: {path} has no attribute `{part}`")
            obj, path = value, f"{path}.{part}"
        return Resolution(obj)


class _CodeChecker(ast.NodeVisitor):
    """Checks one piece of Python code against the names it (or its file) imports from cache-dit/diffusers."""

    def __init__(self, resolver: Resolver, env: dict[str, str]):
        self.resolver = resolver
        self.env = dict(env)
        self.found: list[tuple[int, str, bool]] = []
        self._inner: set[int] = set()

    def run(self, tree: ast.AST) -> list[tuple[int, str, bool]]:
        for name in _local_names(tree):
            self.env.pop(name, None)
        self.env.update(imports_of(tree))
        self.visit(tree)
        return self.found

    def _report(self, line: int, resolution: Resolution) -> None:
        if resolution.error:
            self.found.append((line, resolution.error, resolution.warning))

    def _dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.env:
            return ".".join([self.env[node.id], *reversed(parts)])
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _is_root(alias.name):
                self._report(node.lineno, self.resolver.resolve(alias.name))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module and _is_root(node.module):
            module = self.resolver.resolve(node.module)
            self._report(node.lineno, module)
            if module.error is None:
                for alias in node.names:
                    if alias.name != "*":
                        self._report(node.lineno, self.resolver.resolve(f"{node.module}.{alias.name}"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Attribute):
            self._inner.add(id(node.value))
        if id(node) not in self._inner:
            dotted = self._dotted(node)
            if dotted is not None:
                self._report(node.lineno, self.resolver.resolve(dotted))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = self._dotted(node.func)
        if dotted is not None:
            resolution = self.resolver.resolve(dotted)
            if resolution.obj is not None:
                for keyword in _unknown_keywords(resolution.obj, node):
                    self.found.append((node.lineno, f"`{dotted}` takes no argument `{keyword}`", False))
                for message in wrong_keyword_values(resolution.obj, node):
                    self.found.append((node.lineno, f"`{dotted}`: {message}", False))
        self.generic_visit(node)


def _unknown_keywords(obj: Any, call: ast.Call) -> list[str]:
    if not callable(obj):
        return []
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return []
    names = {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return [k.arg for k in call.keywords if k.arg is not None and k.arg not in names]


def imports_of(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted path, for the cache-dit/diffusers imports in `tree`."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_root(alias.name):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_root(node.module):
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _local_names(tree: ast.AST) -> set[str]:
    """Names the code binds by other means than a cache-dit/diffusers import (they shadow the file's imports)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            roots = isinstance(node, ast.ImportFrom) and node.level == 0 and _is_root(node.module or "")
            for alias in node.names:
                if not (roots or (isinstance(node, ast.Import) and _is_root(alias.name))):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _parse(code: str) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return None


def _regex_names(code: str) -> Iterator[tuple[int, str]]:
    """Fallback for code that does not parse: `from cache_dit.x import A, B` lines and dotted names."""
    for offset, line in enumerate(code.split("\n")):
        match = _FROM_IMPORT.match(line)
        if match:
            yield offset, match.group(1)
            for name in match.group(2).split(","):
                name = name.strip().split(" as ")[0].strip()
                if name:
                    yield offset, f"{match.group(1)}.{name}"
            continue
        for dotted in _DOTTED.findall(line):
            yield offset, dotted


def file_imports(doc: Document) -> dict[str, str]:
    env: dict[str, str] = {}
    for fence in doc.fences:
        if fence.language in PYTHON_FENCES:
            tree = _parse(fence.content)
            if tree is not None:
                env.update(imports_of(tree))
    return env


def _check_code(code: str, first_line: int, env: dict[str, str], resolver: Resolver,
                doc: Document, span: bool = False) -> Iterator[Problem]:
    tree = _parse(code)
    if tree is not None:
        found = _CodeChecker(resolver, env).run(tree)
        found += [(line, message, False) for line, message in wrong_assignments(tree)] if span else []
        for line, message, warning in found:
            yield Problem(doc.rel, first_line + line - 1, message, warning=warning)
        return
    for offset, dotted in _regex_names(code):
        resolution = resolver.resolve(dotted)
        if resolution.error:
            yield Problem(doc.rel, first_line + offset, resolution.error, warning=resolution.warning)


def check_apis(skill: Skill, resolver: Resolver | None = None) -> Iterator[Problem]:
    resolver = resolver or Resolver()
    for doc in skill.docs.values():
        env = {root: root for root in ROOTS} | file_imports(doc)
        for fence in doc.fences:
            if fence.language in PYTHON_FENCES:
                yield from _check_code(fence.content, fence.line, env, resolver, doc)
        for span in doc.code_spans:
            yield from _check_code(span.text, span.line, env, resolver, doc, span=True)
    yield from check_generate_commands(skill)
    yield from check_class_names(skill)
