"""The build step pyproject.toml cannot say: the skill's data (SKILL.md, references/, checklists/, notebooks/,
examples/) is copied from the checkout into the package as `ditgate/_data`, so an installed wheel finds it
(`ditgate.core.paths.data_root`). Everything else is in pyproject.toml."""

import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


def data_parts() -> tuple[str, ...]:
    """DATA_PARTS from src/ditgate/core/paths.py, read without importing the package."""
    tree = ast.parse((HERE / "src" / "ditgate" / "core" / "paths.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "DATA_PARTS":
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("src/ditgate/core/paths.py defines no DATA_PARTS")


class BuildWithData(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "ditgate" / "_data"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for part in data_parts():
            source = HERE / part
            if source.is_dir():
                shutil.copytree(source, target / part, ignore=SKIP)
            else:
                shutil.copy2(source, target / part)


setup(cmdclass={"build_py": BuildWithData})
