"""Running the notebooks with papermill, in order, into one folder: kernels, typed parameters, outcomes."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable
from ditgate.core import logs
from ditgate.run.exec import files as store
from ditgate.notebooks.catalog import GateFailed, GateInconclusive, Notebook, NotebookError


def choose_kernel(requested: str | None, available: dict[str, str] | None = None) -> str:
    """`requested`, else "ditgate", else "python3": the first installed Jupyter kernel; a clear error if none is."""
    if available is None:
        from jupyter_client.kernelspec import KernelSpecManager

        available = KernelSpecManager().find_kernel_specs()
    install = "python -m ipykernel install --sys-prefix --name ditgate"
    if requested:
        if requested not in available:
            raise NotebookError(f"no Jupyter kernel named {requested!r}; installed: "
                                f"{', '.join(sorted(available)) or 'none'}")
        return requested
    for name in ("ditgate", "python3"):
        if name in available:
            return name
    raise NotebookError(f"neither a 'ditgate' nor a 'python3' Jupyter kernel is installed; install one with `{install}`"
                        " (scripts/setup.sh does)")


def parameters(nb: Notebook) -> dict[str, dict[str, Any]]:
    """The notebook's parameters as papermill reads them: name -> {inferred_type_name, default, help}."""
    import papermill

    return papermill.inspect_notebook(str(nb.path))


def _typed(name: str, text: str, type_name: str) -> Any:
    try:
        if type_name == "int":
            return int(text)
        if type_name == "float":
            return float(text)
        if type_name == "bool":
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise NotebookError(f"parameter {name} takes {type_name}, got {text!r}") from None
    return text


def notebook_parameters(nb: Notebook, given: dict[str, str]) -> dict[str, Any]:
    """The `given` values (strings) that `nb` declares, converted to the declared types."""
    declared = parameters(nb)
    return {k: _typed(k, v, declared[k]["inferred_type_name"]) for k, v in given.items() if k in declared}


@dataclass
class Outcome:
    notebook: str
    status: str            # passed, failed (the gate), error (anything else), not run
    seconds: float | None = None
    reason: str = ""
    output: str | None = None
    result: str | None = None  # path of <phase>.json, when written


def failure(path: Path) -> tuple[str, str] | None:
    """(exception name, message) of the first error output of an executed notebook; None when there is none."""
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                return output.get("ename", ""), output.get("evalue", "")
    return None


def run_notebooks(notebooks: list[Notebook], out_dir: Path, given: dict[str, str], *, kernel: str | None = None,
                  keep_going: bool = False, progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Execute `notebooks` in order with papermill into `out_dir`; `given` (name -> text) are parameters, passed
    to the notebooks that declare them. Stops at the first failure unless `keep_going`."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    progress = progress or logs.progress
    kernel_name = choose_kernel(kernel)
    unknown = set(given) - {k for nb in notebooks for k in parameters(nb)}
    if unknown:
        raise NotebookError(f"no selected notebook takes parameter(s) {', '.join(sorted(unknown))}")
    values = [notebook_parameters(nb, given) for nb in notebooks]  # every conversion error before anything runs
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    stop = False
    for nb, params in zip(notebooks, values):
        if stop:
            outcomes.append(Outcome(nb.stem, "not run", reason="an earlier notebook failed"))
            continue
        output, result = out_dir / f"{nb.stem}.ipynb", out_dir / f"{nb.phase}.json"
        result.unlink(missing_ok=True)  # a result left by an earlier run must not stand for this one
        progress(f"{nb.stem}: running with kernel {kernel_name} -> {output}")
        start = time.perf_counter()
        try:
            papermill.execute_notebook(str(nb.path), str(output), parameters={**params, "out": str(out_dir)},
                                       kernel_name=kernel_name, progress_bar=False)
            status, reason = "passed", ""
        except PapermillExecutionError as exc:
            ename, evalue = failure(output) or (exc.ename, exc.evalue)
            status = {GateFailed.__name__: "failed", GateInconclusive.__name__: "inconclusive"}.get(ename, "error")
            reason = f"{ename}: {evalue}"
        except Exception as exc:  # noqa: BLE001 - the kernel died or could not start: recorded, the run goes on
            status, reason = "error", f"{type(exc).__name__}: {exc}"
        outcome = Outcome(nb.stem, status, round(time.perf_counter() - start, 1), reason, str(output),
                          str(result) if result.is_file() else None)
        outcomes.append(outcome)
        progress(f"{nb.stem}: {status} in {outcome.seconds:.1f} s")
        stop = status != "passed" and not keep_going
    store.write_json(out_dir / "notebooks.json", {"kernel": kernel_name, "parameters": given,
                                                  "notebooks": [asdict(o) for o in outcomes]})
    return outcomes


def summary(outcomes: list[Outcome], width: int = 160) -> str:
    """The summary table: notebook, status, seconds, the reason of a failure (first line, shortened)."""
    rows = [(o.notebook, o.status.upper(), "–" if o.seconds is None else f"{o.seconds:.1f}",
             (o.reason.splitlines() or [""])[0][:width]) for o in outcomes]
    headers = ("notebook", "status", "seconds", "reason")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)]) + "\n"
