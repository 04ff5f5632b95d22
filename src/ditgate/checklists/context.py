"""What a named check is and what it gets: the registry entry (`NamedCheck`, its arguments), the context it runs in (the model, its anatomy, the loaded pipeline, extra rows) and its `Outcome`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from ditgate.core.errors import DitgateError
from ditgate.core.model import Model
from ditgate.run.define.rows import Row


EXACT_PHASE = "cp"  # the gate used for "equals the baseline": an exact phase (image gate + float32 tensor rule)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


class NamedCheckError(DitgateError):
    """A named check cannot be evaluated (missing input, unknown argument)."""


@dataclass(frozen=True)
class Outcome:
    status: str  # "pass" or "fail"
    evidence: str


def passed(evidence: str) -> Outcome:
    return Outcome("pass", evidence)


def failed(evidence: str) -> Outcome:
    return Outcome("fail", evidence)


@dataclass
class Context:
    """What a check may look at. The checklist runner fills `anatomy`, `run_dir` and `report` as it goes."""

    model: Model  # the model, its call, dtype and device (ditgate.core.model)
    integration_path: Path | None = None
    anatomy: dict[str, Any] | None = None
    run_dir: Path | None = None
    report: dict[str, Any] | None = None
    cache_config: dict[str, Any] = field(default_factory=dict)  # --cache-config: on top of the default cache rows'
    plugged_lists: list[dict[str, Any]] | None = None  # block lists observed after the plugin's block_adapter ran
    _integration: Any = field(default=None, repr=False)
    _pipe: Any = field(default=None, repr=False)

    def integration(self):
        """The integration file, imported once (None without --integration)."""
        if self.integration_path is None:
            return None
        if self._integration is None:
            from ditgate.core import plugin

            self._integration = plugin.load(self.integration_path)
        return self._integration

    def pipe(self):
        if self._pipe is None:
            self._pipe = self.model.load()
        return self._pipe

    def drop_pipe(self) -> None:
        import gc

        self._pipe = None
        gc.collect()

    def need_anatomy(self) -> dict[str, Any]:
        if self.anatomy is None:
            raise NamedCheckError("the inspect anatomy of the model is not available")
        return self.anatomy

    def row(self, name: str) -> dict[str, Any] | None:
        rows = (self.report or {}).get("rows", [])
        return next((r for r in rows if r["name"] == name), None)


@dataclass(frozen=True)
class Arg:
    kind: type = str
    choices: tuple[Any, ...] | None = None
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class NamedCheck:
    name: str
    summary: str
    run: Callable[[Context, dict[str, Any]], Outcome]
    args: dict[str, Arg] = field(default_factory=dict)
    anatomy: bool = False  # needs the inspect anatomy
    pipe: bool = False  # needs the loaded pipeline (not changed)
    mutates: bool = False  # changes the pipeline it is given: runs after the runner, on a fresh load
    rows: Callable[[Context, dict[str, Any]], list[Row]] | None = None  # runner rows it is judged on

    def arg_errors(self, args: Any) -> list[tuple[str, str]]:
        """(field, problem) for every argument that does not fit this check."""
        if not isinstance(args, dict):
            return [("args", "must be a mapping")]
        problems = [(f"args.{k}", f"unknown argument of {self.name}; it takes: {', '.join(self.args) or 'none'}")
                    for k in args if k not in self.args]
        for key, spec in self.args.items():
            if key not in args:
                if spec.required:
                    problems.append((f"args.{key}", f"{self.name} needs this argument"))
                continue
            value = args[key]
            if not isinstance(value, spec.kind) or isinstance(value, bool) and spec.kind is not bool:
                problems.append((f"args.{key}", f"must be {spec.kind.__name__}, got {value!r}"))
            elif spec.choices is not None and value not in spec.choices:
                problems.append((f"args.{key}", f"{value!r} is not one of {', '.join(map(str, spec.choices))}"))
        return problems

    def with_defaults(self, args: dict[str, Any] | None) -> dict[str, Any]:
        return {k: a.default for k, a in self.args.items() if a.default is not None} | dict(args or {})


# ------------------------------------------------------------------------------------------------ helpers
def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]
