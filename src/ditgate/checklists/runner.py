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
import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core import logs
from ditgate.checklists.context import Context, NamedCheck, Outcome
from ditgate.checklists.named import CHECKS
from ditgate.checklists.files import Checklist, ChecklistError, Item
from ditgate.checklists.facts import check_fact





















































# ---------------------------------------------------------------------------------------------------- running
@dataclass
class RunOptions:
    model: Any  # ditgate.core.model.Model: the model, its call, dtype and device
    integration: Path | None = None
    twin: str = "auto"  # twin rows (ditgate.run.twinned)
    out: Path | None = None
    timeout: float = 600.0
    progress: Callable[[str], None] | None = None
    from_run: Path | None = None  # a `ditgate run` folder whose finished rows are reused (copied into `out`)
    cache_config: dict[str, Any] = field(default_factory=dict)  # --cache-config, as `ditgate run` takes it
    launch: str = "once"  # --launch, as `ditgate run` takes it
    variants: Callable[[list], list] | None = None  # --prompts / --seeds: the lossy rows' variants added to the rows
    row_args: list[str] = field(default_factory=list)  # those options as given, for the reproducing command
    reuse: bool = False  # reference rows from the result store, as `ditgate run` (ditgate.run.reuse; --fresh: off)


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
    if row["status"] == "inconclusive":  # neither done nor failed: its gate cannot judge it here (the reason says why)
        return Outcome("inconclusive", f"{name} inconclusive: {reasons}")
    if row["status"] == "error" and (row.get("error") or {}).get("preflight"):
        return Outcome("error", f"{name} could not run here: {reasons}")
    return Outcome("fail", f"{name} {row['status']}: {reasons}" + (f" ({metrics})" if metrics else ""))


def _guard(fn: Callable[[], Outcome]) -> Outcome:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a check that cannot be evaluated is recorded as an error
        return Outcome("error", f"{type(exc).__name__}: {exc}")


def _isolated(ctx: Context, fn: Callable[[], Outcome]) -> Outcome:
    from ditgate.run.exec.isolation import ClassSnapshot

    snapshot = ClassSnapshot.of(ctx.pipe())
    try:
        return fn()
    finally:
        snapshot.restore()


def _check_of(item: Item) -> NamedCheck:
    return CHECKS[item.check["name"]]


def _anatomy(ctx: Context, opts: RunOptions) -> dict[str, Any]:
    from ditgate.inspect.anatomy import analyse, build_call

    pipe = ctx.pipe()
    probe_call, dropped = build_call(pipe, opts.model.request)  # the call the rows make: one request for both
    return analyse(pipe, probe_call, model=opts.model.name, steps=probe_call.get("num_inference_steps"),
                   dropped=dropped, seed=opts.model.request.seed).to_dict()


def _fresh_folder(opts: RunOptions) -> Path:
    from ditgate.run.runner import default_out

    run_dir = Path(opts.out) if opts.out else default_out(opts.model.name)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ChecklistError(f"{run_dir} is not empty; choose another --out (a checklist always runs afresh)")
    if opts.from_run is not None and not (Path(opts.from_run) / "run.json").is_file():
        raise ChecklistError(f"--from-run {opts.from_run} is not a run folder of `ditgate run` (no run.json)")
    if opts.from_run is not None:  # its rows are copied: a link in it would copy what it points at
        from ditgate.run.exec.folder import refuse_links

        refuse_links(Path(opts.from_run), "copy the rows of")
    return run_dir


def _needs_anatomy(item: Item) -> bool:
    return item.kind == "inspect" or item.kind == "named" and _check_of(item).anatomy or \
        item.kind == "row" and bool(item.check.get("size"))


_SIZE_WHY = {  # why the call's size does not do for a row item's `size`, in words
    "vaep": "decodes in one VAE tile of {tile} pixels, so VAE-P has nothing to spread",
    "cp": "has {tokens} tokens, which do not split evenly over 2, 4 and 8 ranks",
}


def _row_size(item: Item, anatomy: dict[str, Any] | None, call: dict[str, Any]) -> tuple[int, int] | None:
    """(height, width) a row item runs at when its feature does not act at the call's size (its `size`: the
    smallest size where it does, from the anatomy's `sizes`); None: at the call's size."""
    key = item.check.get("size")
    found = ((anatomy or {}).get("sizes") or {}).get(key) if key else None
    if not found or tuple(found) == (call.get("height"), call.get("width")):
        return None
    return int(found[0]), int(found[1])


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
        """ONE runner call at the call's size: every row item, plus the rows that named checks are judged on; and
        one more per other size that a row item's `size` asks for (its own folder `at-HxW` in the run folder)."""
        from ditgate.run.define.rows import BASELINE, DEFAULT_ROWS, select, with_cache_config
        from ditgate.run.runner import RunConfig, copy_finished_rows, run

        call = self.opts.model.request.call
        sized = {(c.name, i.id): hw for c, i in self.items
                 if i.kind == "row" and (hw := _row_size(i, self.ctx.anatomy, call)) is not None}
        for hw in dict.fromkeys(sized.values()):
            self.run_sized(run_dir, hw, [(c, i) for c, i in self.items if sized.get((c.name, i.id)) == hw])
        wanted = list(dict.fromkeys(i.check["row"] for c, i in self.items
                                    if i.kind == "row" and (c.name, i.id) not in sized))
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
        chosen = with_cache_config(select(DEFAULT_ROWS, wanted), self.opts.cache_config) if wanted else []
        if extra and BASELINE.name not in {r.name for r in chosen}:
            chosen.insert(0, BASELINE)
        chosen += [r for n, r in extra.items() if n not in {x.name for x in chosen}]
        chosen = self.opts.variants(chosen) if self.opts.variants else chosen
        self.say(f"checklist: running rows {', '.join(r.name for r in chosen)}")
        o = self.opts
        if o.from_run is not None:
            copy_finished_rows(Path(o.from_run), run_dir, [r.name for r in chosen])
        cfg = RunConfig(model=o.model, rows=chosen, out=run_dir, integration=o.integration, timeout=o.timeout, twin=o.twin,
                        resume=o.from_run is not None, launch=o.launch, reuse=o.reuse)
        self.ctx.report = run(cfg, progress=self.say)
        self.ctx.run_dir = Path(self.ctx.report["run_dir"])
        for c, i in self.items:
            if i.kind == "row" and (c.name, i.id) not in sized:
                self.outcomes[c.name, i.id] = _row_outcome(self.ctx.row(i.check["row"]), i.check["row"])

    def run_sized(self, run_dir: Path, hw: tuple[int, int], items: list[tuple[Checklist, Item]]) -> None:
        """The row items that need size `hw` (and their baselines), in a runner call of their own at that size."""
        from dataclasses import replace

        from ditgate.run.define.rows import DEFAULT_ROWS, select, with_cache_config
        from ditgate.run.runner import RunConfig, run

        o, req = self.opts, self.opts.model.request
        model = o.model.with_request(replace(req, call={**req.call, "height": hw[0], "width": hw[1]}))
        folder = run_dir / f"at-{hw[0]}x{hw[1]}"
        names = list(dict.fromkeys(i.check["row"] for c, i in items))
        self.say(f"checklist: running rows {', '.join(names)} at {hw[0]}x{hw[1]} (in {folder})")
        rows = with_cache_config(select(DEFAULT_ROWS, names), o.cache_config)
        rows = o.variants(rows) if o.variants else rows
        report = run(RunConfig(model=model, rows=rows, out=folder, integration=o.integration, timeout=o.timeout,
                               twin=o.twin, launch=o.launch, reuse=o.reuse), progress=self.say)
        sizes = self.ctx.anatomy["sizes"]
        at = f"{req.call.get('height')}x{req.call.get('width')}"
        for c, i in items:
            why = _SIZE_WHY[i.check["size"]].format(**sizes)
            row = next((r for r in report["rows"] if r["name"] == i.check["row"]), None)
            outcome = _row_outcome(row, i.check["row"])
            self.outcomes[c.name, i.id] = Outcome(
                outcome.status, f"at {hw[0]}x{hw[1]}, not the call's {at}, which {why} (rows in {folder.name}/): "
                                f"{outcome.evidence}")


def run_checklists(checklists: list[Checklist], opts: RunOptions) -> list[dict[str, Any]]:
    """Run every automated item; returns the filled-in copies (checklist data with `run` and item `result`s).

    Order: inspect; named checks that only read the pipeline (on the inspected copy); the runner; named checks
    judged on its rows; named checks that change a pipeline (each on a fresh load).
    """
    from ditgate.core.request import added as request_added
    from ditgate.run.exec.folder import versions as _versions

    run_dir = _fresh_folder(opts)
    if opts.from_run is not None:  # refuse a run of another model or request now, not after the inspection
        from ditgate.run.runner import RunConfig, check_resumable

        check_resumable(Path(opts.from_run), RunConfig(model=opts.model, rows=[], integration=opts.integration))
    ctx = Context(model=opts.model, integration_path=opts.integration, cache_config=dict(opts.cache_config))
    session = _Session(opts, ctx, [(c, i) for c in checklists for i in c.items if i.automated],
                       opts.progress or logs.progress)
    session.inspect()
    session.run_named(lambda check: not check.rows and not check.mutates)
    ctx.drop_pipe()
    session.run_rows(run_dir)
    session.run_named(lambda check: bool(check.rows))
    session.run_named(lambda check: True)
    ctx.drop_pipe()
    run_info = {
        "model": opts.model.name, "integration": str(opts.integration) if opts.integration else None,
        "pipeline": opts.model.pipeline, "trust_remote_code": opts.model.trust_remote_code,
        "command": reproduce_command([c.name for c in checklists], opts),
        "dtype": opts.model.dtype, "device": opts.model.device, "request": opts.model.request.to_dict(),
        "added_to_call": request_added(opts.model.request),
        "run_dir": str(run_dir),
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "versions": _versions(),
    }
    run_info = json.loads(json.dumps(run_info, default=str))  # plain types only (torch's version is a str subclass)
    return [fill(c, session.outcomes, run_info) for c in checklists]


def _as_option(value: Any) -> str:
    """VALUE of `--call KEY=VALUE` that parses back to `value` (a string that reads as JSON is quoted)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def reproduce_command(names: list[str], opts: RunOptions) -> str:
    """The `ditgate checklist` command line that makes this run again: every call argument of the request as it
    ran (steps and frames under the pipeline's own names), the pipeline class, the integration, dtype and device."""
    import shlex

    model = opts.model
    req = model.request
    words = ["ditgate", "checklist", ",".join(names), "--model", model.name]
    if model.pipeline:
        words += ["--pipeline", model.pipeline]
    if model.trust_remote_code:
        words.append("--trust-remote-code")
    if opts.integration:
        words += ["--integration", str(opts.integration)]
    for key, value in req.call.items():
        words += ["--call", f"{key}={_as_option(value)}"]
    if req.image and req.image != "generated":
        words += ["--image", req.image]
    words += ["--seed", str(req.seed), "--dtype", model.dtype, "--device", model.device]
    if opts.cache_config:
        words += ["--cache-config", *(f"{k}={_as_option(v)}" for k, v in opts.cache_config.items())]
    return shlex.join(words + list(opts.row_args))


def fill(checklist: Checklist, outcomes: dict[tuple[str, str], Outcome], run_info: dict[str, Any]) -> dict[str, Any]:
    """The checklist's data with a `result` per item and a `run` summary."""
    data = {k: v for k, v in checklist.data.items() if k not in ("items", "run")}
    items, counts = [], dict.fromkeys(("pass", "fail", "error", "manual", "inconclusive"), 0)
    for raw, item in zip(checklist.data["items"], checklist.items):
        if item.automated:
            outcome = outcomes.get((checklist.name, item.id), Outcome("error", "the check did not run"))
        else:
            outcome = Outcome("manual", f"to record: {item.check['evidence']}")
        counts[outcome.status] += 1
        items.append({k: v for k, v in raw.items() if k != "result"}
                     | {"result": {"status": outcome.status, "evidence": outcome.evidence}})
    failed = counts["fail"] or counts["error"]
    data["run"] = run_info | {"passed": not failed and not counts["inconclusive"], "counts": counts,
                              "outcome": "failed" if failed else "inconclusive" if counts["inconclusive"] else "passed"}
    data["items"] = items
    return data


def write_filled(filled: dict[str, Any]) -> Path:
    """Write a filled-in copy as `<run_dir>/checklist-<name>.yaml` (temporary file, then rename)."""
    import yaml

    from ditgate.run.exec.files import write_text

    path = Path(filled["run"]["run_dir"]) / f"checklist-{filled['name']}.yaml"
    write_text(path, yaml.safe_dump(filled, sort_keys=False, allow_unicode=True, width=120))
    return path
