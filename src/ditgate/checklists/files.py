"""Checklist files: `checklists/NAME.yaml` read and validated against `checklists/checklist.schema.json` and against what can be checked (known rows, inspect facts, named checks, anchors in the skill)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from ditgate.core.errors import DitgateError
from ditgate.checklists.named import CHECKS
from ditgate.core.paths import checklists_dir, data_root


SCHEMA_FILE = "checklist.schema.json"


class ChecklistError(DitgateError):
    """A checklist file is missing, unreadable or invalid; the message names the file, the item and the field."""


@dataclass(frozen=True)
class Item:
    id: str
    text: str
    ref: str
    check: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.check["kind"]

    @property
    def automated(self) -> bool:
        return self.kind != "manual"


@dataclass
class Checklist:
    name: str
    title: str
    path: Path
    items: list[Item]
    data: dict[str, Any] = field(repr=False)


# ---------------------------------------------------------------------------------------------------- finding
def available() -> list[str]:
    return sorted(p.stem for p in checklists_dir().glob("*.yaml"))


def checklist_path(name: str) -> Path:
    """`cache` -> checklists/cache.yaml; a path to a YAML file is taken as it is."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ChecklistError(f"checklist file {path} does not exist")
        return path
    path = checklists_dir() / f"{name}.yaml"
    if not path.is_file():
        elsewhere = ("; the quantization and compile phases are rows of `ditgate matrix` (its checklist: "
                     "perf-matrix)") if name in ("quantization", "compile") else ""
        raise ChecklistError(f"no checklist {name!r}; available: {', '.join(available())}{elsewhere}")
    return path


# ---------------------------------------------------------------------------------------------------- validating
def _schema() -> dict:
    return json.loads((checklists_dir() / SCHEMA_FILE).read_text())


def _where(path: Path, data: Any, loc: list) -> tuple[str, list]:
    """('item 'x' (items[3])', rest of the location) for a location inside an item, else ('top level', loc)."""
    if len(loc) >= 2 and loc[0] == "items" and isinstance(loc[1], int):
        items = data.get("items") if isinstance(data, dict) else None
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        ident = item.get("id") if isinstance(item, dict) else None
        label = f"item {ident!r} (items[{loc[1]}])" if isinstance(ident, str) else f"items[{loc[1]}]"
        return label, loc[2:]
    return "top level", loc


def _problem(path: Path, data: Any, loc: list, message: str) -> str:
    where, rest = _where(path, data, loc)
    field_name = ".".join(str(p) for p in rest) or "(the whole entry)"
    return f"{_shown(path)}: {where}: field {field_name}: {message}"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(data_root()))
    except (ValueError, DitgateError):
        return str(path)


def _schema_problems(path: Path, data: Any) -> tuple[list[str], set[int | None]]:
    """The schema's complaints, and the indexes of the items they concern (None: outside any item)."""
    import jsonschema
    from jsonschema.exceptions import best_match

    validator = jsonschema.Draft202012Validator(_schema())
    problems, bad_items = [], set()
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        if error.context:  # anyOf: report the branch meant for this kind of value
            error = best_match([e for e in error.context if e.validator != "type"] or error.context)
        loc = list(error.absolute_path)
        bad_items.add(loc[1] if len(loc) >= 2 and loc[0] == "items" and isinstance(loc[1], int) else None)
        if error.validator == "required":
            for name in error.validator_value:
                if isinstance(error.instance, dict) and name not in error.instance:
                    problems.append(_problem(path, data, loc + [name], "required field is missing"))
        elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set(error.schema.get("properties", {}))
            for name in sorted(set(error.instance) - known):
                problems.append(_problem(path, data, loc + [name], "unknown field; allowed: "
                                         + ", ".join(sorted(known))))
        else:
            problems.append(_problem(path, data, loc, error.message))
    return list(dict.fromkeys(problems)), bad_items


def _known_rows() -> set[str]:
    from ditgate.run.define.rows import DEFAULT_ROWS, REFERENCE_ROWS

    return {r.name for r in DEFAULT_ROWS} | set(REFERENCE_ROWS)


def _unwrap(hint: Any) -> Any:
    """`X | None` -> X; a union of several types -> Any."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return hint


def fact_problem(fact: str) -> str | None:
    """Why `fact` is no path into the inspect JSON (`Anatomy.to_dict()`), or None when it is one."""
    try:
        from ditgate.inspect.anatomy import Anatomy
        from ditgate.inspect.plan.support import Support
    except ImportError as exc:
        return f"ditgate inspect is not available here ({exc})"
    overrides = {(Anatomy, "cache_dit"): Support}  # a plain dict in Anatomy, built from Support.to_dict()
    hint: Any = Anatomy
    walked: list[str] = []
    for part in fact.split("."):
        hint = _unwrap(hint)
        here = ".".join(walked) or "the inspect JSON"
        if hint is Any:
            return None
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint):
            hints = typing.get_type_hints(hint)
            if part not in hints:
                return f"{here} has no key {part!r}; keys: {', '.join(hints)}"
            hint = overrides.get((hint, part), hints[part])
        elif origin in (list, tuple):
            if part != "*" and not part.isdigit():
                return f"{here} is a list: address its elements with * or an index, not {part!r}"
            hint = typing.get_args(hint)[0]
        elif origin is dict:
            hint = typing.get_args(hint)[1]
        else:
            return f"{here} is a single value ({getattr(hint, '__name__', hint)}); it has no key {part!r}"
        walked.append(part)
    return None


def _anchors(rel: str, cache: dict[str, set[str] | None]) -> set[str] | None:
    if rel not in cache:
        from ditgate.skill.markdown import parse

        root = data_root()
        cache[rel] = parse(root / rel, root).anchors() if (root / rel).is_file() else None
    return cache[rel]


def _item_problems(path: Path, data: dict, skip: set[int]) -> list[str]:
    problems = []
    seen: set[str] = set()
    known_rows = _known_rows()
    anchors: dict[str, set[str] | None] = {}
    for index, item in enumerate(data["items"]):
        loc = ["items", index]
        ident = item.get("id") if isinstance(item, dict) else None
        if isinstance(ident, str) and ident in seen:
            problems.append(_problem(path, data, loc + ["id"], f"duplicate id {ident!r}"))
        seen.add(ident)
        if index in skip:  # the schema found this item malformed: the checks below need its shape
            continue
        rel, _, anchor = item["ref"].partition("#")
        found = _anchors(rel, anchors)
        if found is None:
            problems.append(_problem(path, data, loc + ["ref"], f"{rel} does not exist"))
        elif anchor not in found:
            problems.append(_problem(path, data, loc + ["ref"], f"{rel} has no heading with the anchor #{anchor}"))
        check = item["check"]
        if check["kind"] == "row" and check["row"] not in known_rows:
            problems.append(_problem(path, data, loc + ["check", "row"], f"unknown row {check['row']!r}; known: "
                                     + ", ".join(sorted(known_rows))))
        elif check["kind"] == "inspect" and (why := fact_problem(check["fact"])):
            problems.append(_problem(path, data, loc + ["check", "fact"], why))
        elif check["kind"] == "named":
            named = CHECKS.get(check["name"])
            if named is None:
                problems.append(_problem(path, data, loc + ["check", "name"], f"unknown named check "
                                         f"{check['name']!r}; known: {', '.join(sorted(CHECKS))}"))
            else:
                for where, why in named.arg_errors(check.get("args", {})):
                    problems.append(_problem(path, data, loc + ["check", *where.split(".")], why))
    return problems


def validate(path: Path, data: Any) -> list[str]:
    """Every problem of one checklist (schema, ids, rows, named checks and their arguments, facts, references)."""
    problems, bad_items = _schema_problems(path, data)
    if not isinstance(data, dict) or not isinstance(data.get("items"), list) or None in bad_items:
        return problems  # the deeper checks need the shape the schema guarantees
    problems += _item_problems(path, data, bad_items)
    in_repo = path.resolve().parent == checklists_dir().resolve()
    if in_repo and data["name"] != path.stem:
        problems.append(_problem(path, data, ["name"], f"{data['name']!r} differs from the file name {path.stem!r}"))
    return problems


def _read(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ChecklistError(f"{_shown(path)}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ChecklistError(f"{_shown(path)}: not valid YAML: {exc}") from None


def load(name_or_path: str | Path) -> Checklist:
    """Read and validate one checklist; raises ChecklistError listing every problem."""
    path = checklist_path(str(name_or_path))
    data = _read(path)
    problems = validate(path, data)
    if problems:
        raise ChecklistError("\n".join(problems))
    items = [Item(i["id"], i["text"], i["ref"], i["check"]) for i in data["items"]]
    return Checklist(data["name"], data["title"], path, items, data)


def validate_all(names: list[str] | None = None) -> list[Checklist]:
    """Load every named checklist (default: all in checklists/); raises one ChecklistError with every problem."""
    found, problems = [], []
    for name in names or available():
        try:
            found.append(load(name))
        except ChecklistError as exc:
            problems.append(str(exc))
    if problems:
        raise ChecklistError("\n".join(problems))
    return found
