"""Class names written alone in a code span must exist (part of the `api` rule).

A code span that is one CamelCase name ending in a kind the skill talks about (`...Pipeline`, `...Planner`,
`...Functor`, `...Model`, `...Config`, `...Processor`, `...Adapter`) names a class: it must be defined in the
installed cache-dit or diffusers (a `class NAME` in their sources, so classes that are not exported count), be
exported by transformers, or be defined in the skill's own examples/ (`TinyMMAttnProcessor`). Placeholders
(`MyModelPipeline`, `YourDiT...`) are not looked up. `FluxTransfomer2DModel` fails.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from ditgate.skill.base import Problem, Skill

CLASS_SPAN = re.compile(r"^[A-Z][A-Za-z0-9_]*(?:Pipeline|Planner|Functor|Model|Config|Processor|Adapter)$")
_PLACEHOLDER = re.compile(r"^(?:My|Your)[A-Z0-9_]|xxx|XXX|Xxx")
_CLASS = re.compile(r"^\s*class\s+([A-Za-z_]\w*)", re.MULTILINE)
SOURCES = ("cache_dit", "diffusers")


def _classes_in(folder: Path) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        try:
            found.update(_CLASS.findall(path.read_text(encoding="utf-8", errors="replace")))
        except OSError:
            continue
    return found


@functools.lru_cache(maxsize=1)
def library_classes() -> frozenset[str] | None:
    """Every class defined in the installed cache-dit and diffusers sources; None when one is not installed."""
    found: set[str] = set()
    for package in SOURCES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        for location in spec.submodule_search_locations:
            found |= _classes_in(Path(location))
    return frozenset(found)


def _exported_by_transformers(name: str) -> bool:
    try:
        return hasattr(importlib.import_module("transformers"), name)
    except Exception:  # noqa: BLE001 - lazy modules raise all sorts of errors on a missing name
        return False


def check_class_names(skill: Skill) -> Iterator[Problem]:
    own = _classes_in(skill.root / "examples") if (skill.root / "examples").is_dir() else set()
    known = None
    for doc in skill.docs.values():
        for span in doc.code_spans:
            name = span.text.strip()
            if not CLASS_SPAN.match(name) or _PLACEHOLDER.search(name) or name in own:
                continue
            known = known if known is not None else library_classes()
            if known is None:
                yield Problem(doc.rel, span.line, f"cannot check `{name}`: cache-dit or diffusers is not installed",
                              warning=True)
                return
            if name not in known and not _exported_by_transformers(name):
                yield Problem(doc.rel, span.line, f"`{name}` is not a class of the installed cache-dit, diffusers or"
                                                  " transformers, nor of the skill's examples/")
