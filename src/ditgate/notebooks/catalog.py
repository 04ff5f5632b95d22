"""The notebooks of the repository's `notebooks/` folder: which exist, their phase, kind and order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from ditgate.core.errors import DitgateError
from ditgate.core.paths import data_root


class GateFailed(DitgateError):
    """A phase's gate failed; the message names each failing row and why."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it: the verdict, not a traceback into ditgate (the banner above says the rest)."""
        return [f"GateFailed: {self}"]


class GateInconclusive(GateFailed):
    """A phase's gate could not judge a row (status `inconclusive`: neither passed nor failed); the message says why."""

    def _render_traceback_(self) -> list[str]:
        return [f"GateInconclusive: {self}"]


class NotebookError(DitgateError):
    """A notebook cannot be run as asked: unknown name, unknown or mistyped parameter, no Jupyter kernel."""


@dataclass(frozen=True)
class Notebook:
    stem: str        # file name without .ipynb: "30_cp"
    phase: str       # what it checks; its result is <out>/<phase>.json
    title: str
    kind: str        # "inspect", "rows", "final", "matrix": which cells it has
    model: str = "zoo:flux"  # default of its `model` parameter
    world_size: int = 2      # default of its `world_size` parameter (rows of more than one rank)
    in_all: bool = True      # part of `ditgate notebook run all` (the integration route)

    @property
    def path(self) -> Path:
        return notebooks_dir() / f"{self.stem}.ipynb"


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("00_inspect", "inspect", "Inspect: the model's anatomy and a draft plan", "inspect"),
    Notebook("10_baseline", "baseline", "Baseline: the single-process reference", "rows"),
    Notebook("20_cache", "cache", "Cache (DBCache)", "rows"),
    Notebook("30_cp", "cp", "Context parallelism (Ulysses, ring, cache + Ulysses)", "rows"),
    Notebook("40_tp", "tp", "Tensor parallelism", "rows"),
    Notebook("50_tep", "tep", "Text-encoder parallelism", "rows"),
    Notebook("60_vaep", "vaep", "VAE parallelism", "rows"),
    Notebook("70_final", "final", "Final: hybrid CP x TP and the results table", "final", world_size=4),
    Notebook("80_perf_matrix", "perf_matrix", "Perf matrix: acceptance benchmark of a supported model", "matrix",
             in_all=False),
    Notebook("90_audio", "audio", "Audio route: cache on an audio model, gated against its noise floor", "rows",
             model="zoo:stable-audio", in_all=False),
)


# What the rows of a notebook check, when it is not a phase of `ditgate run`'s rows by itself.
ROW_PHASE = {"final": "hybrid", "audio": "cache"}


def notebooks_dir() -> Path:
    return data_root() / "notebooks"


def find(names: str) -> list[Notebook]:
    """Notebooks named in `names`: "all" (the integration route, 00-70), or a comma-separated list of phases
    ("cp") or file stems ("30_cp"). Order follows NOTEBOOKS."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return [nb for nb in NOTEBOOKS if nb.in_all]
    known = {key: nb for nb in NOTEBOOKS for key in (nb.phase, nb.stem)}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise NotebookError(f"unknown notebook(s) {', '.join(unknown) or '(none given)'}; use all, or any of: "
                            + ", ".join(nb.phase for nb in NOTEBOOKS))
    chosen = {known[n].stem for n in wanted}
    return [nb for nb in NOTEBOOKS if nb.stem in chosen]
