"""Executable checklists: one YAML file per phase or route (`checklists/NAME.yaml`), validated and run.

A checklist is a list of items taken from the skill's references (format: `checklists/checklist.schema.json`).
Each item is checked one of four ways:

- `row`: a row of the phase runner (`ditgate run`) passes: its gate holds and its feature proved it acted;
- `inspect`: a fact of the model's anatomy (`ditgate inspect MODEL --json`) meets an expectation;
- `named`: a check of the registry in `ditgate.checklists.named`;
- `manual`: checked by hand; the item says what evidence to record.

`run_checklists` runs every automated item of one or more checklists with one inspect pass and ONE runner call
(all `row` items and the rows named checks need, batched), and returns filled-in copies: each item gets a
`result` {status: pass | fail | manual | error, evidence}. `write_filled` writes a copy next to the run's report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError
from ditgate.checklists.named import CHECKS, Context, NamedCheck, Outcome
from ditgate.core.paths import checklists_dir, repo_root

SCHEMA_FILE = "checklist.schema.json"
INSPECT_STEPS = 2  # denoising steps of the observed run, as `ditgate inspect` does by default
_MISSING = object()


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
        raise ChecklistError(f"no checklist {name!r}; available: {', '.join(available())}")
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
        return str(path.resolve().relative_to(repo_root()))
    except (ValueError, FileNotFoundError):
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
    from ditgate.run.rows import DEFAULT_ROWS, REFERENCE_ROWS

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
        from ditgate.inspect.support import Support
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

        root = repo_root()
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


# ---------------------------------------------------------------------------------------------------- facts
def fact_values(data: Any, fact: str) -> list[tuple[str, Any]]:
    """(concrete path, value) for every value `fact` addresses; a missing key gives _MISSING."""
    found: list[tuple[str, Any]] = [("", data)]
    for part in fact.split("."):
        nxt = []
        for where, value in found:
            here = f"{where}.{part}" if where else part
            if part == "*" and isinstance(value, (list, dict)):
                items = enumerate(value) if isinstance(value, list) else value.items()
                nxt += [(f"{where}.{k}" if where else str(k), v) for k, v in items]
            elif isinstance(value, dict):
                nxt.append((here, value.get(part, _MISSING)))
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                nxt.append((here, value[int(part)]))
            else:
                nxt.append((here, _MISSING))
        found = nxt
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 in Python; not here
        return type(a) is type(b) and a == b
    return a == b


def expect_holds(expect: Any, value: Any) -> bool:
    if value is _MISSING:
        return isinstance(expect, dict) and expect.get("present") is False
    if not isinstance(expect, dict):
        return _same(value, expect)
    (op, arg), = expect.items()
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if op == "equals":
        return _same(value, arg)
    if op == "not_equals":
        return not _same(value, arg)
    if op == "one_of":
        return any(_same(value, a) for a in arg)
    if op == "at_least":
        return number and value >= arg
    if op == "at_most":
        return number and value <= arg
    if op == "present":
        return (value is not None) == arg
    if op == "empty":
        return (value is None or (hasattr(value, "__len__") and len(value) == 0)) == arg
    raise ChecklistError(f"unknown expectation {op!r}")


def describe_expect(expect: Any) -> str:
    if not isinstance(expect, dict):
        return f"equals {expect!r}"
    (op, arg), = expect.items()
    return {"equals": f"equals {arg!r}", "not_equals": f"differs from {arg!r}", "one_of": f"is one of {arg!r}",
            "at_least": f"is at least {arg!r}", "at_most": f"is at most {arg!r}",
            "present": "is present" if arg else "is absent", "empty": "is empty" if arg else "is not empty"}[op]


def _short(value: Any, limit: int = 160) -> str:
    text = "missing" if value is _MISSING else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_fact(anatomy: dict[str, Any], fact: str, expect: Any) -> Outcome:
    values = fact_values(anatomy, fact)
    wanted = describe_expect(expect)
    if not values:
        return Outcome("fail", f"{fact}: no value to check (the list is empty); expected: {wanted}")
    bad = [(p, v) for p, v in values if not expect_holds(expect, v)]
    shown = "; ".join(f"{p} = {_short(v)}" for p, v in (bad or values)[:6])
    if bad:
        return Outcome("fail", f"{shown} (expected: {wanted})")
    return Outcome("pass", f"{shown} ({wanted})")


# ---------------------------------------------------------------------------------------------------- running
@dataclass
class RunOptions:
    model: str
    request: Any  # ditgate.core.request.Request
    dtype: str = "float32"
    device: str = "cpu"
    integration: Path | None = None
    pipeline: str | None = None
    trust_remote_code: bool = False
    out: Path | None = None
    timeout: float = 600.0
    progress: Callable[[str], None] | None = None
    from_run: Path | None = None  # a `ditgate run` folder whose finished rows are reused (copied into `out`)


def _row_outcome(row: dict[str, Any] | None, name: str) -> Outcome:
    from ditgate.gates.verdicts import format_value

    if row is None:
        return Outcome("error", f"the row {name} is not in the run")
    metrics = ", ".join(f"{k} {format_value(k, v)}" for k, v in (row.get("metrics") or {}).items()
                        if k != "worst_tile_ssim" and v is not None)
    proofs = "; ".join(p["detail"] for p in row.get("proofs") or [])
    if row["status"] in ("passed", "reference"):
        return Outcome("pass", "; ".join(x for x in (f"{name} passed: {metrics}" if metrics else f"{name} ran",
                                                      proofs) if x))
    reasons = "; ".join(row.get("reasons") or []) or "no reason recorded"
    if row["status"] == "error" and (row.get("error") or {}).get("preflight"):
        return Outcome("error", f"{name} could not run here: {reasons}")
    return Outcome("fail", f"{name} {row['status']}: {reasons}" + (f" ({metrics})" if metrics else ""))


def _guard(fn: Callable[[], Outcome]) -> Outcome:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a check that cannot be evaluated is recorded as an error
        return Outcome("error", f"{type(exc).__name__}: {exc}")


def _isolated(ctx: Context, fn: Callable[[], Outcome]) -> Outcome:
    from ditgate.run.isolation import ClassSnapshot

    snapshot = ClassSnapshot.of(ctx.pipe())
    try:
        return fn()
    finally:
        snapshot.restore()


def _check_of(item: Item) -> NamedCheck:
    return CHECKS[item.check["name"]]


def _anatomy(ctx: Context, opts: RunOptions) -> dict[str, Any]:
    from ditgate import zoo
    from ditgate.inspect.anatomy import analyse, build_call

    call = opts.request.call
    pipe = ctx.pipe()
    probe_call, dropped = build_call(pipe, zoo.read_meta(ctx.model_path).get("call"), height=call.get("height"),
                                     width=call.get("width"), frames=call.get("num_frames"), steps=INSPECT_STEPS)
    return analyse(pipe, probe_call, model=opts.model, steps=INSPECT_STEPS, dropped=dropped).to_dict()


def _fresh_folder(opts: RunOptions) -> Path:
    from ditgate.run.runner import default_out

    run_dir = Path(opts.out) if opts.out else default_out(opts.model)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ChecklistError(f"{run_dir} is not empty; choose another --out (a checklist always runs afresh)")
    if opts.from_run is not None and not (Path(opts.from_run) / "run.json").is_file():
        raise ChecklistError(f"--from-run {opts.from_run} is not a run folder of `ditgate run` (no run.json)")
    return run_dir


def _needs_anatomy(item: Item) -> bool:
    return item.kind == "inspect" or item.kind == "named" and _check_of(item).anatomy


@dataclass
class _Session:
    """One run of one or more checklists: the shared context, and each item's outcome as it is decided."""

    opts: RunOptions
    ctx: Context
    items: list[tuple[Checklist, Item]]
    say: Callable[[str], None]
    outcomes: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    memo: dict[str, Outcome] = field(default_factory=dict)  # a check with the same arguments runs once

    def named(self) -> list[tuple[Checklist, Item]]:
        return [(c, i) for c, i in self.items if i.kind == "named"]

    def inspect(self) -> None:
        """The anatomy, once, on a pipeline nothing has touched (after the integration file registered planners)."""
        from ditgate.core.plugin import PluginError

        if not any(_needs_anatomy(i) for c, i in self.items):
            return
        self.say("checklist: inspecting the model")
        with contextlib.suppress(PluginError):  # a broken integration file is reported by the items that use it
            self.ctx.integration()
        try:
            self.ctx.anatomy = _anatomy(self.ctx, self.opts)
        except Exception as exc:  # noqa: BLE001 - every item that needs it reports this
            error = Outcome("error", f"ditgate inspect failed: {type(exc).__name__}: {exc}")
            self.outcomes.update(((c.name, i.id), error) for c, i in self.items if _needs_anatomy(i))
            return
        for c, i in self.items:
            if i.kind == "inspect":
                self.outcomes[c.name, i.id] = check_fact(self.ctx.anatomy, i.check["fact"], i.check["expect"])

    def run_named(self, select: Callable[[NamedCheck], bool]) -> None:
        for c, i in self.named():
            check = _check_of(i)
            if (c.name, i.id) in self.outcomes or not select(check):
                continue
            args = check.with_defaults(i.check.get("args"))
            key = check.name + json.dumps(args, sort_keys=True)
            if key not in self.memo and check.mutates:  # a pipeline of its own; class-level patches undone after
                self.ctx.drop_pipe()
                self.memo[key] = _guard(lambda: _isolated(self.ctx, lambda: check.run(self.ctx, args)))
                self.ctx.drop_pipe()
            elif key not in self.memo:
                self.memo[key] = _guard(lambda: check.run(self.ctx, args))
            self.outcomes[c.name, i.id] = self.memo[key]

    def run_rows(self, run_dir: Path) -> None:
        """ONE runner call: every row item, plus the rows that named checks are judged on."""
        from ditgate.run.rows import BASELINE, DEFAULT_ROWS, select
        from ditgate.run.runner import RunConfig, copy_finished_rows, run

        wanted = list(dict.fromkeys(i.check["row"] for c, i in self.items if i.kind == "row"))
        extra = {}
        for c, i in self.named():
            check = _check_of(i)
            if check.rows:
                try:
                    extra.update((r.name, r) for r in check.rows(self.ctx, check.with_defaults(i.check.get("args"))))
                except Exception as exc:  # noqa: BLE001 - recorded for the item
                    self.outcomes[c.name, i.id] = Outcome("error", f"{type(exc).__name__}: {exc}")
        if not wanted and not extra:
            return
        chosen = select(DEFAULT_ROWS, wanted) if wanted else []
        if extra and BASELINE.name not in {r.name for r in chosen}:
            chosen.insert(0, BASELINE)
        chosen += [r for n, r in extra.items() if n not in {x.name for x in chosen}]
        self.say(f"checklist: running rows {', '.join(r.name for r in chosen)}")
        o = self.opts
        if o.from_run is not None:
            copy_finished_rows(Path(o.from_run), run_dir, [r.name for r in chosen])
        cfg = RunConfig(model=o.model, rows=chosen, request=o.request, out=run_dir, dtype=o.dtype, device=o.device,
                        integration=o.integration, pipeline=o.pipeline, trust_remote_code=o.trust_remote_code,
                        timeout=o.timeout, resume=o.from_run is not None)
        self.ctx.report = run(cfg, progress=self.say)
        self.ctx.run_dir = Path(self.ctx.report["run_dir"])
        for c, i in self.items:
            if i.kind == "row":
                self.outcomes[c.name, i.id] = _row_outcome(self.ctx.row(i.check["row"]), i.check["row"])


def run_checklists(checklists: list[Checklist], opts: RunOptions) -> list[dict[str, Any]]:
    """Run every automated item; returns the filled-in copies (checklist data with `run` and item `result`s).

    Order: inspect; named checks that only read the pipeline (on the inspected copy); the runner; named checks
    judged on its rows; named checks that change a pipeline (each on a fresh load).
    """
    from ditgate.core.loader import resolve
    from ditgate.run.runner import _versions

    run_dir = _fresh_folder(opts)
    if opts.from_run is not None:  # refuse a run of another model or request now, not after the inspection
        from ditgate.run.runner import RunConfig, check_resumable

        check_resumable(Path(opts.from_run), RunConfig(model=opts.model, rows=[], request=opts.request,
                                                       dtype=opts.dtype, device=opts.device,
                                                       integration=opts.integration), resolve(opts.model))
    ctx = Context(model=opts.model, model_path=resolve(opts.model), request=opts.request, dtype=opts.dtype,
                  device=opts.device, integration_path=opts.integration, pipeline=opts.pipeline,
                  trust_remote_code=opts.trust_remote_code)
    session = _Session(opts, ctx, [(c, i) for c in checklists for i in c.items if i.automated],
                       opts.progress or (lambda line: print(line, file=sys.stderr, flush=True)))
    session.inspect()
    session.run_named(lambda check: not check.rows and not check.mutates)
    ctx.drop_pipe()
    session.run_rows(run_dir)
    session.run_named(lambda check: bool(check.rows))
    session.run_named(lambda check: True)
    ctx.drop_pipe()
    run_info = {
        "model": opts.model, "integration": str(opts.integration) if opts.integration else None,
        "dtype": opts.dtype, "device": opts.device, "request": opts.request.to_dict(), "run_dir": str(run_dir),
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "versions": _versions(),
    }
    run_info = json.loads(json.dumps(run_info, default=str))  # plain types only (torch's version is a str subclass)
    return [fill(c, session.outcomes, run_info) for c in checklists]


def fill(checklist: Checklist, outcomes: dict[tuple[str, str], Outcome], run_info: dict[str, Any]) -> dict[str, Any]:
    """The checklist's data with a `result` per item and a `run` summary."""
    data = {k: v for k, v in checklist.data.items() if k not in ("items", "run")}
    items, counts = [], dict.fromkeys(("pass", "fail", "error", "manual"), 0)
    for raw, item in zip(checklist.data["items"], checklist.items):
        if item.automated:
            outcome = outcomes.get((checklist.name, item.id), Outcome("error", "the check did not run"))
        else:
            outcome = Outcome("manual", f"to record: {item.check['evidence']}")
        counts[outcome.status] += 1
        items.append({k: v for k, v in raw.items() if k != "result"}
                     | {"result": {"status": outcome.status, "evidence": outcome.evidence}})
    data["run"] = run_info | {"passed": counts["fail"] == 0 and counts["error"] == 0, "counts": counts}
    data["items"] = items
    return data


def write_filled(filled: dict[str, Any]) -> Path:
    """Write a filled-in copy as `<run_dir>/checklist-<name>.yaml` (temporary file, then rename)."""
    import yaml

    from ditgate.run.store import write_text

    path = Path(filled["run"]["run_dir"]) / f"checklist-{filled['name']}.yaml"
    write_text(path, yaml.safe_dump(filled, sort_keys=False, allow_unicode=True, width=120))
    return path
