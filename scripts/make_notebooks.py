"""Write notebooks/NN_phase.ipynb from `ditgate.notebooks.NOTEBOOKS`: thin cells, no outputs.

    python scripts/make_notebooks.py            rewrite notebooks/
    python scripts/make_notebooks.py --check    exit 1 when a committed notebook differs from what this writes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from ditgate.notebooks import NOTEBOOKS, Notebook, notebooks_dir

# name: (type, default or None for the notebook's own, help). Order is the order in the parameters cell.
PARAMETERS = {
    "model": ("str", None, "model folder (with model_index.json) or zoo:NAME"),
    "integration": ("str", '""', "plugin file (block_adapter / cp_plan / tp_plan); \"\": cache-dit's registries"),
    "rows": ("str", '""', "comma-separated rows of `ditgate run` instead of the phase's rows; \"\": the phase's"),
    "tier": ("str", '"A"', "A: 1-2 devices; B adds 4; C adds 8 and hybrid CP x TP"),
    "world_size": ("int", None, "ranks of the parallel rows"),
    "pipeline": ("str", '""', "module:Class of a pipeline outside diffusers; \"\": the folder's model_index.json"),
    "trust_remote_code": ("bool", "False", "allow code shipped in the model folder to run"),
    "call": ("str", '""', "JSON object of pipeline call arguments, e.g. '{\"guidance_scale\": 4.5}'"),
    "call_file": ("str", '""', "JSON or YAML file of pipeline call arguments"),
    "image": ("str", '""', "input image file (I2V, edit); \"\": a seeded test image where one is needed"),
    "height": ("int", "0", "0: the model's default"),
    "width": ("int", "0", "0: the model's default"),
    "frames": ("int", "0", "video frames; 0: the model's default"),
    "steps": ("int", "0", "denoising steps; 0: the default"),
    "dtype": ("str", '"auto"', "auto: bfloat16 on a GPU, float32 on a CPU; or float32, bfloat16, float16"),
    "device": ("str", '"auto"', "cpu, cuda or auto"),
    "gates": ("str", '""', "gate table; \"\": checklists/gates.json"),
    "warmup": ("int", "-1", "untimed calls first; -1: ditgate matrix's default"),
    "repeats": ("int", "0", "timed calls, median reported; 0: ditgate matrix's default"),
    "timeout": ("float", "600.0", "seconds a parallel group may go without progress"),
    "resume": ("bool", "False", "keep rows already finished in <out>/<phase>"),
    "out": ("str", '""', "results folder; \"\": a new folder under runs/"),
}
REQUEST = ("pipeline", "trust_remote_code", "call", "call_file", "image", "height", "width", "frames", "steps",
           "dtype", "device")  # what every notebook passes to the one request object
KIND_PARAMETERS = {
    "inspect": ("model", *REQUEST, "out"),
    "rows": ("model", "integration", "rows", "world_size", *REQUEST, "gates", "timeout", "resume", "out"),
    "matrix": ("model", "integration", "tier", "rows", *REQUEST, "warmup", "repeats", "timeout", "out"),
}
# Parameters a notebook of that phase leaves out: they would do nothing there (an audio request has a duration, no
# picture size; single-process phases have no ranks).
LEFT_OUT = {"baseline": ("integration", "rows", "world_size", "gates", "timeout"), "cache": ("world_size",),
            "audio": ("height", "width", "frames", "world_size", "image")}
# (kind, parameter): (default, help) where a kind differs from PARAMETERS.
OWN = {("matrix", "rows"): ('""', "comma-separated rows of the tier; \"\": all of them")}
RUN_ARGS = ("rows", "world_size", "integration", *REQUEST, "gates", "timeout", "resume")

INTRO = {
    "inspect": "Observes one short run of the pipeline and reports what the gate check asks: block lists and their "
               "ForwardPattern, transformer calls per step, attention, sequence and divisibility, and what cache-dit "
               "already registers. Writes the draft plan to `<out>/plan.md`. Fails when a called block list matches "
               "no ForwardPattern. Read `SKILL.md` (gate check).",
    "baseline": "Runs the single-process reference that every phase is compared with. Fails when it does not run or "
                "its output holds NaN or Inf.",
    "cache": "Runs the `cache` row (DBCache, static schedule) against the baseline. Read `references/cache.md`.",
    "cp": "Runs Ulysses and ring context parallelism, and the cache enabled before Ulysses, each against its "
          "baseline. Read `references/cp.md`.",
    "tp": "Runs tensor parallelism of the transformer against the baseline. Read `references/tp.md`.",
    "tep": "Runs TP with the text encoder sharded against the baseline. Read `references/tep.md`.",
    "vaep": "Runs TP with VAE parallelism against the baseline decoded with the tiled VAE. Read `references/vaep.md`.",
    "final": "Runs the hybrid Ulysses x TP row, then shows the results table of every phase result found in `out` "
             "(run the earlier notebooks into the same `out` first). Fails when the hybrid row or an earlier phase "
             "failed. Read `references/testing.md` (final results table).",
    "perf_matrix": "Runs `ditgate matrix`: cache presets, compile, quantization, CP and TP against one baseline, "
                   "with speedups and their predictions. Read `references/perf_matrix.md`.",
    "audio": "Runs the cache row on an audio model; audio rows are gated against the measured noise floor of a "
             "calibration rerun. Read `references/audio.md`.",
}
GATE_NOTE = ("Every threshold comes from `checklists/gates.json` (or the table named by `gates`); the last cell "
             "writes `<out>/{phase}.json` and raises `GateFailed` when the gate fails.")
RUN_WITH = ("Run it: `papermill notebooks/{stem}.ipynb out.ipynb -p model {model} -p out runs/nb`, or "
            "`ditgate notebook run {phase} {model} --out runs/nb`.")


def _parameter_names(nb: Notebook) -> list[str]:
    names = KIND_PARAMETERS["rows" if nb.kind == "final" else nb.kind]
    return [n for n in names if n not in LEFT_OUT.get(nb.phase, ())]


def _parameters_cell(nb: Notebook) -> str:
    names = _parameter_names(nb)
    own = {"model": f'"{nb.model}"', "world_size": str(nb.world_size)}
    lines = []
    for name in names:
        kind, default, text = PARAMETERS[name]
        default, text = OWN.get((nb.kind, name), (default, text))
        lines.append(f"{name}: {kind} = {default if default is not None else own[name]}  # {text}")
    return "\n".join(lines)


def _call(head: str, args: list[str], width: int = 110) -> str:
    """`head(arg, arg, ...)`, broken into lines of at most `width` characters, continuation lines aligned."""
    lines, line = [], head + "("
    for i, arg in enumerate(args):
        piece = arg + (")" if i == len(args) - 1 else ",")
        if len(line) + 1 + len(piece) > width and not line.endswith("("):
            lines.append(line)
            line = " " * (len(head) + 1) + piece
        else:
            line += ("" if line.endswith("(") else " ") + piece
    return "\n".join(lines + [line])


def _work_cells(nb: Notebook) -> list[str]:
    names = _parameter_names(nb)
    start = "from ditgate import notebooks as nb\n\nout_dir = nb.results_dir(out, model)\n"
    if nb.kind in ("inspect", "matrix"):
        name, function = {"inspect": ("anatomy", "inspect"), "matrix": ("matrix", "run_matrix")}[nb.kind]
        args = ["model", "out_dir"] + [f"{n}={n}" for n in names if n not in ("model", "out")]
        return [start + _call(f"{name} = nb.{function}", args), f"nb.show({name})",
                f'result = nb.finish("{nb.phase}", {name}, out_dir)']
    args = [f'"{nb.phase}"', "model", "out_dir"] + [f"{n}={n}" for n in RUN_ARGS if n in names]
    shown = "nb.show(report, results_of=out_dir)" if nb.kind == "final" else "nb.show(report)"
    return [start + _call("report = nb.run_phase", args), shown, f'result = nb.finish("{nb.phase}", report, out_dir)']


def build(nb: Notebook) -> nbformat.NotebookNode:
    v4 = nbformat.v4
    intro = (f"# {nb.stem}: {nb.title}\n\n{INTRO[nb.phase]}\n\n" + GATE_NOTE.format(phase=nb.phase) + "\n\n"
             + RUN_WITH.format(stem=nb.stem, phase=nb.phase, model=nb.model))
    cells = [v4.new_markdown_cell(intro), v4.new_code_cell(_parameters_cell(nb), metadata={"tags": ["parameters"]})]
    cells += [v4.new_code_cell(source) for source in _work_cells(nb)]
    for i, cell in enumerate(cells):
        cell.id = f"{nb.stem.replace('_', '-')}-{i}"  # stable ids: regenerating changes nothing
    notebook = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "ditgate", "display_name": "ditgate", "language": "python"},
        "language_info": {"name": "python"}})
    nbformat.validate(notebook)
    return notebook


def text(nb: Notebook) -> str:
    return nbformat.writes(build(nb)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--dir", type=Path, default=notebooks_dir(), help="folder of the notebooks")
    args = parser.parse_args(argv)
    stale = []
    for nb in NOTEBOOKS:
        path = args.dir / f"{nb.stem}.ipynb"
        wanted = text(nb)
        if args.check:
            if not path.is_file() or path.read_text() != wanted:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted)
    if stale:
        print("out of date (run python scripts/make_notebooks.py): " + ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
