"""The runtime's layering: packages follow the data path, lower packages never import higher ones, no import cycles.

Every import in `src/ditgate` counts, the ones inside functions too (an import deferred to call time is still a
dependency). The order is the README's layout section; `skill` sits beside the stages and imports only `core`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ditgate"

# package -> the ditgate packages it may import (besides itself). A sub-package is named with its parent
# ("run.exec"); a package allowed to import a parent may import every sub-package of it.
ALLOWED = {
    "core": {"zoo"},
    "zoo": {"core"},
    "metrics": {"core"},
    "gates": {"core", "metrics"},
    "twin": {"core", "zoo"},
    "inspect": {"core", "zoo"},
    "inspect.flops": {"core", "zoo", "twin"},
    "inspect.plan": {"core", "zoo", "inspect", "inspect.flops"},
    "run": {"core", "zoo", "twin", "metrics", "gates", "inspect", "run.define", "run.exec", "run.judge", "run.report",
            "run.diff", "run.reuse"},
    # the runner's rooms, in the order data flows through them: each imports only the rooms before it
    "run.define": {"core", "zoo", "inspect"},
    "run.exec": {"core", "zoo", "metrics", "gates", "inspect", "run.define"},
    "run.judge": {"core", "zoo", "metrics", "gates", "inspect", "run.define", "run.exec"},
    "run.report": {"core", "zoo", "metrics", "gates", "inspect", "run.define", "run.exec", "run.judge"},
    "run.diff": {"core", "zoo", "metrics", "gates", "inspect", "run.define", "run.exec", "run.judge"},
    "run.reuse": {"core", "zoo", "gates", "run.define", "run.exec"},  # the result store (after exec, before judging)
    "scaffold": {"core", "zoo", "twin", "inspect"},  # a plugin written from the observed anatomy
    "export": {"core", "zoo", "twin", "metrics", "gates", "inspect", "run"},
    "perf": {"core", "zoo", "twin", "metrics", "gates", "inspect", "run"},
    "skill": {"core", "cli"},  # the linter checks the skill's command lines with the CLI's own parser
    "skill.rules": {"core", "cli", "skill"},
    "checklists": {"core", "zoo", "twin", "metrics", "gates", "inspect", "run", "skill"},
    "notebooks": {"core", "zoo", "twin", "metrics", "gates", "inspect", "run", "perf"},
    "commands": {"core", "zoo", "twin", "metrics", "gates", "inspect", "scaffold", "run", "export", "perf", "skill",
                 "checklists", "notebooks", "cli"},
    "commands.model": {"core", "zoo", "twin", "metrics", "gates", "inspect", "scaffold", "run", "export", "perf", "skill",
                       "checklists", "notebooks", "cli"},
    "commands.tools": {"core", "zoo", "twin", "metrics", "gates", "inspect", "scaffold", "run", "export", "perf", "skill",
                       "checklists", "notebooks", "cli"},
    "cli": {"commands", "core", "top"},
    "top": {"core", "cli"},  # ditgate/__init__.py, ditgate/__main__.py
}
MAX_MODULES = 12  # modules a package holds, its __init__ and sub-packages not counted


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str:
    """The package a module belongs to: its deepest package directory below `ditgate` ("run.exec")."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "top"
    path = _file_of(module)
    inner = parts[1:] if path is not None and path.name == "__init__.py" else parts[1:-1]
    return ".".join(inner) or parts[1]


def _rules(package: str) -> set[str]:
    """What `package` may import: its ALLOWED entry, else its parent's (and the parent itself)."""
    if package in ALLOWED:
        return ALLOWED[package]
    parent = package.rpartition(".")[0]
    return _rules(parent) | {parent}


def _allowed(mine: str, theirs: str) -> bool:
    """May package `mine` import package `theirs`: itself and its own sub-packages, what its rules name, and the
    sub-packages of a package its rules name (unless that package is one of its own parents: siblings are ordered)."""
    if theirs == mine or theirs.startswith(mine + "."):
        return True
    rules = _rules(mine)
    return theirs in rules or any(theirs.startswith(p + ".") and not mine.startswith(p + ".") for p in rules)


def _imports(path: Path) -> set[str]:
    """The ditgate modules `path` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text())
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ditgate"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "ditgate":
                continue
            if target != "ditgate":  # the root package holds only __version__ and the lazy `ditgate.load`
                found.add(target)
            for alias in node.names:  # `from ditgate.run import store` imports the module ditgate.run.exec.files
                candidate = f"{target}.{alias.name}"
                if _file_of(candidate) is not None:
                    found.add(candidate)
    return found


def _file_of(module: str) -> Path | None:
    parts = module.split(".")[1:]
    if not parts:
        return SRC / "__init__.py"
    rel = Path(*parts)
    for path in (SRC / rel.with_suffix(".py"), SRC / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        graph[_module_name(path)] = {m for m in _imports(path) if _file_of(m) is not None}
    return graph


def test_every_package_is_placed():
    packages = {_package(m).split(".")[0] for m in _graph()}
    assert packages <= set(ALLOWED), f"packages without a layer: {sorted(packages - set(ALLOWED))}"


def test_lower_packages_never_import_higher_ones():
    problems = []
    for module, deps in _graph().items():
        mine = _package(module)
        for dep in deps:
            theirs = _package(dep)
            if not _allowed(mine, theirs):
                problems.append(f"{module} imports {dep} ({mine} may import only {sorted(_rules(mine))})")
    assert not problems, "\n".join(sorted(problems))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep == node or _is_package_of(dep, node):
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _is_package_of(package: str, module: str) -> bool:
    """A module importing its own package's `__init__` (for a sibling) is not a cycle through that module."""
    return module.startswith(package + ".")


def test_no_import_cycles():
    graph = _graph()
    # a package's __init__ re-exports its modules; a module naming `ditgate.gates` means the package interface
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_planted_violation(tmp_path, monkeypatch):
    """The rule can fail: a metrics module importing the runner is reported."""
    fake = tmp_path / "ditgate"
    (fake / "metrics").mkdir(parents=True)
    (fake / "run").mkdir()
    (fake / "metrics" / "bad.py").write_text("from ditgate.run.runner import run\n")
    (fake / "run" / "runner.py").write_text("def run():\n    pass\n")
    (fake / "run" / "loop.py").write_text("from ditgate.run import runner\n")
    (fake / "run" / "back.py").write_text("from ditgate.run import loop\n")
    (fake / "run" / "__init__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    with pytest.raises(AssertionError, match="ditgate.metrics.bad imports ditgate.run.runner"):
        test_lower_packages_never_import_higher_ones()
    (fake / "run" / "runner.py").write_text("from ditgate.run import back\n")
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()


def test_packages_say_what_they_own_and_may_import():
    for init in sorted(SRC.glob("*/**/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, f"{init.relative_to(SRC)} has no docstring"
        assert "import" in doc, f"{init.relative_to(SRC)}'s docstring does not say what it may import"


def test_modules_stay_small():
    big = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 420}
    assert not big, f"modules over ~400 lines: {big}"


def test_packages_stay_small():
    """No package holds more than MAX_MODULES modules: a bigger one is split into sub-packages by what they do."""
    big = {}
    for init in SRC.glob("**/__init__.py"):
        n = len([p for p in init.parent.glob("*.py") if p.name != "__init__.py"])
        if n > MAX_MODULES:
            big[str(init.parent.relative_to(SRC))] = n
    assert not big, f"packages over {MAX_MODULES} modules: {big}"


def test_the_checker_sees_a_sub_package_out_of_order(tmp_path, monkeypatch):
    """The rooms of the runner are layered too: the execution room importing the judging room is reported."""
    fake = tmp_path / "ditgate"
    for room in ("exec", "judge"):
        (fake / "run" / room).mkdir(parents=True)
        (fake / "run" / room / "__init__.py").write_text("")
    (fake / "run" / "__init__.py").write_text("")
    (fake / "run" / "judge" / "proofs.py").write_text("def check():\n    pass\n")
    (fake / "run" / "exec" / "execute.py").write_text("from ditgate.run.judge import proofs\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    with pytest.raises(AssertionError, match="ditgate.run.exec.execute imports ditgate.run.judge.proofs"):
        test_lower_packages_never_import_higher_ones()
    (fake / "run" / "exec" / "execute.py").write_text("")
    (fake / "run" / "judge" / "proofs.py").write_text("from ditgate.run.exec import execute\n")
    test_lower_packages_never_import_higher_ones()
