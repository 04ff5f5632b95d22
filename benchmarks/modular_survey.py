"""Every ModularPipeline class of the installed diffusers, run through ditgate's rows where a tiny one can be built.

    OMP_NUM_THREADS=1 python benchmarks/modular_survey.py [--only Flux3ModularPipeline,...] [--device cpu|cuda]
        [--out DIR] [--merge PREVIOUS.json] [--render SURVEY.json]

For each class diffusers exports (`*ModularPipeline`), the survey looks for a tiny seeded offline model:
- a model built as the modular class itself (zoo:flux3, zoo:cosmos3-distilled, and the distilled FLUX.3 built here
  by `ditgate.zoo.modular_builders.build_flux3(distilled=True)`: no standard class exists), or
- a standard zoo model (`zoo:NAME` or `zoo:pipe/NAME`) whose folder diffusers maps to the class
  (`ModularPipeline.from_pretrained` on its `model_index.json`), loaded with `--pipeline diffusers:<Class>`.
A class with neither is classified by the components its default blocks expect (what a tiny builder would need).
Each built model runs the rows baseline, cache, cp-ulysses-2 and tp-2 with `ditgate run` (one run per model, the
integration file where one exists) and each cell is the row's status: passed, failed, error, or its first reason.

Writes DIR/modular_survey.json and DIR/modular_survey.md (default benchmarks/results/) and prints the table with
the survey's wall time. `--merge` keeps a previous run's rows for the models not run now (a subset rerun with
`--only`); `--render` writes the table of a JSON again with the classification in NOTES.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("baseline", "cache", "cp-ulysses-2", "tp-2")
FLUX3_PLUGIN = ROOT / "examples" / "flux3" / "integration.py"
COSMOS3_PLUGIN = ROOT / "examples" / "cosmos3" / "integration.py"
# Modular classes with no standard twin, built as the class itself: model (zoo entry or a folder built here), plugin.
MODULAR_ONLY = {
    "Flux3ModularPipeline": ("zoo:flux3", FLUX3_PLUGIN),
    "Flux3DistilledModularPipeline": ("flux3-distilled", FLUX3_PLUGIN),
    "Cosmos3DistilledModularPipeline": ("zoo:cosmos3-distilled", COSMOS3_PLUGIN),
}
RUN_TIMEOUT_S = 1200  # one model's four rows; a run that takes longer is reported as such
# Classification of the gaps, with the evidence (set from the measured table; see benchmarks/README.md).
NOTES: dict[str, str] = {
    "StableDiffusion3ModularPipeline": (
        "cp, tp: cache-dit 1.5.3 has no CP or TP planner for SD3Transformer2DModel (none under "
        "cache_dit/distributed/transformers/; planners are looked up by the transformer class, so the standard "
        "StableDiffusion3Pipeline has the same gap): a plugin's cp_plan / tp_plan is needed"),
    "LTXModularPipeline@zoo:pipe/ltx-i2v": (
        "cp: not a modular gap: the standard LTXImageToVideoPipeline fails the same way (`ditgate run "
        "zoo:pipe/ltx-i2v --rows baseline,cp-ulysses-2,tp-2`: 96 vs 192 at dim 1, tp-2 passes). "
        "The image-to-video call gives the transformer a per-token timestep [batch, tokens] "
        "(diffusers modular_pipelines/ltx/denoise.py:289, as pipelines/ltx/pipeline_ltx_image2video.py:841), which "
        "cache-dit's LTXVideo CP plan does not split (cache_dit/distributed/transformers/ltxvideo.py:51-59 splits "
        "hidden_states, encoder_hidden_states and the RoPE only): a cp_plan that also splits `timestep` on dim 1"),
    "ZImageModularPipeline": (
        "cp: not a modular gap: the standard ZImagePipeline on the same folder fails the same way (`ditgate run "
        "zoo:pipe/zimage --rows baseline,cp-ulysses-2,tp-2`: cp-ulysses-2 64 vs 32 at dim 1, tp-2 passes); "
        "cache-dit's ZImage CP plan (cache_dit/distributed/transformers/zimage.py:53-80) splits each refiner's and "
        "layer's `x` and `freqs_cis`, not their attention mask, the likely mismatch"),
    "QwenImageModularPipeline": (
        "cp: modular only: the standard QwenImageImg2ImgPipeline on the same folder passes cp-ulysses-2 (`ditgate run "
        "zoo:pipe/qwen-image-img2img --rows baseline,cp-ulysses-2,tp-2`), QwenImagePipeline on zoo:qwen-image passes "
        "cache+ulysses-2 (tests/test_runner.py). Measured with a forward pre-hook on the transformer: the standard "
        "pipeline passes encoder_hidden_states_mask=None (it drops an all-ones mask, diffusers pipelines/qwenimage/"
        "pipeline_qwenimage.py:265-266), the modular blocks an all-ones [1, 64] mask (modular_pipelines/qwenimage/"
        "denoise.py:167, 222); cache-dit's QwenImage CP plan (qwen_image.py:64-86) splits no mask, the probable "
        "break (read from the code). tp: not a modular gap: the standard "
        "QwenImageImg2ImgPipeline fails tp-2 the same way (32 vs 16 at dim 3), cache-dit's QwenImage TP planner "
        "(qwen_image.py:93) on this tiny layout"),
    "WanModularPipeline": (
        "needs ftfy: diffusers' modular Wan text encoder calls `ftfy.fix_text` unguarded (modular_pipelines/wan/"
        "encoders.py:45; the import is guarded at :34, the standard pipelines/wan/pipeline_wan.py:79 guards the "
        "call); without ftfy the baseline fails with NameError (first run); this row ran with ftfy 6.3.1 on the path"),
    "WanImage2VideoModularPipeline": "needs ftfy, as WanModularPipeline (same text encoder block)",
    "(twin of zoo:pipe/qwen-image-edit)": (
        "QwenImageEditPipeline's zoo folder does not build here: transformers' Qwen2VLProcessor fails on its video "
        "processor lookup (AttributeError: VIDEO_PROCESSOR_MAPPING has no _extra_content) in this environment "
        "without torchvision; the QwenImageEditModularPipeline row waits for that builder"),
    "Cosmos3DistilledModularPipeline": (
        "cp: a library limit, not a modular or tiny-model gap: the Cosmos3 attention processor calls causal GQA "
        "attention for the text stream (diffusers models/transformers/transformer_cosmos3.py:94-100), and cache-dit's "
        "templated CP attention refuses causal attention (cache_dit/attention/backends/register.py:313-314) and GQA "
        "without a cp_gqa_strategy (:317-318), as diffusers' own does (models/attention_dispatch.py:2925-2928); the "
        "model keeps CP outside the declarative plan (transformer_cosmos3.py:380-389). cache and tp pass with "
        "examples/cosmos3/integration.py, whose functor replaces cache-dit's registered Cosmos3OmniPatchFunctor: "
        "its transformer forward has no return_dict (cache_dit/caching/patch_functors/functor_cosmos3.py:77-103), "
        "which the blocks pass (modular_pipelines/cosmos/denoise.py:240-241). The folder's config sets "
        "enable_safety_checker false (the guardrail model cannot be built offline)"),
}


def modular_classes() -> list[str]:
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("ModularPipeline") and n != "ModularPipeline")


def needs(name: str) -> str:
    """What a tiny builder of `name` would have to build: the from_pretrained components of its default blocks."""
    import diffusers

    cls = getattr(diffusers, name)
    blocks_name = getattr(cls, "default_blocks_name", None)
    if not blocks_name:
        return "no default blocks"
    try:
        blocks = getattr(diffusers, blocks_name)()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"its blocks {blocks_name} do not build: {type(exc).__name__}: {exc}"
    specs = [c for c in blocks.expected_components if c.default_creation_method == "from_pretrained"]
    return ", ".join(f"{c.name}={getattr(c.type_hint, '__name__', c.type_hint)}" for c in specs)


def twins() -> list[tuple[str, str]]:
    """(zoo model, its standard class) for every zoo entry whose class diffusers maps to a modular class by name
    (`auto_pipeline._get_model` and `MODULAR_PIPELINE_MAPPING`, what `ModularPipeline.from_pretrained` reads from a
    standard folder's model_index.json)."""
    from diffusers.modular_pipelines.modular_pipeline import MODULAR_PIPELINE_MAPPING
    from diffusers.pipelines.auto_pipeline import _get_model

    from ditgate import zoo

    found = []
    for name in [*zoo.names(), *zoo.PIPELINES]:
        model = zoo.get(name)
        try:
            family = _get_model(model.pipeline)
        except Exception:  # noqa: BLE001 - a class the auto-pipeline tables do not know has no modular twin
            continue
        if family in MODULAR_PIPELINE_MAPPING and name not in ("flux3",):
            found.append((f"zoo:{name}", model.pipeline))
    return found


def resolved_class(model: str) -> str:
    """The modular class diffusers resolves the zoo folder of `model` to (configs only, no weights)."""
    from ditgate import zoo
    from ditgate.core import modular

    return type(modular.from_pretrained(zoo.materialize(model), modular.SHORTHAND)).__name__


def build_local(model: str, folder: Path) -> str:
    """A model that is no zoo entry, built into `folder` the zoo's way (seeded, save_pretrained, ditgate.json)."""
    from ditgate import zoo
    from ditgate.zoo import modular_builders

    if model != "flux3-distilled":
        return model
    if not (folder / "modular_model_index.json").is_file():
        modular_builders.build_flux3(0, distilled=True).save_pretrained(str(folder), overwrite_modular_index=True)
        meta = {"zoo": None, "seed": 0, "modality": "image", "call": dict(zoo.get("flux3").call)}
        (folder / zoo.META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return str(folder)


def command(name: str, model: str, integration: Path | None, device: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "ditgate", "run", model, "--rows", ",".join(ROWS), "--out", str(out),
           "--device", device, "--json"]
    if name not in MODULAR_ONLY:  # a standard folder, run through its modular class
        cmd += ["--pipeline", f"diffusers:{name}"]
    if integration is not None:
        cmd += ["--integration", str(integration)]
    return cmd


def run_one(name: str, model: str, integration: Path | None, device: str, out: Path) -> dict:
    cmd = command(name, model, integration, device, out)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"built": "yes", "reason": f"the run took over {RUN_TIMEOUT_S} s", "wall_s": RUN_TIMEOUT_S}
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        return {"built": "no", "reason": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    report = json.loads(proc.stdout)
    cells = {}
    for row in report["rows"]:
        status = row["status"]
        if status in ("failed", "error"):
            why = (row.get("error") or {}).get("message") or "; ".join(row.get("reasons") or [])
            status = f"{status}: {' '.join(why.split())[:160]}"
        cells[row["name"]] = status
    return {"built": "yes", "cells": cells, "wall_s": wall}


def plan(only: set[str] | None) -> tuple[list[tuple[str, str, Path | None]], list[str], dict[str, str]]:
    """(modular class, model, plugin) for every model the survey runs; the classes with no model; the twins whose
    zoo folder does not build, with why."""
    runs = [(name, model, plugin) for name, (model, plugin) in MODULAR_ONLY.items()]
    broken = {}
    for model, standard in twins():
        try:
            runs.append((resolved_class(model), model, None))
        except Exception as exc:  # noqa: BLE001 - a zoo folder that does not build is reported, not fatal
            broken[model] = f"{standard} twin: {model} does not build: {type(exc).__name__}: {exc}".splitlines()[0]
    names = modular_classes()
    runs = [r for r in runs if not only or r[0] in only]
    have = {r[0] for r in runs}
    return sorted(runs), [n for n in names if n not in have and (not only or n in only)], broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated class names")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--merge", type=Path, help="a previous modular_survey.json: its rows for the models not run "
                                                   "now are kept (with --only, to rerun a few)")
    parser.add_argument("--render", type=Path, help="a modular_survey.json: write its table again (NOTES) and stop")
    args = parser.parse_args()
    if args.render:
        data = json.loads(args.render.read_text())
        write(data["results"], data["runs"], data["device"], args.out)
        return 0
    previous = json.loads(args.merge.read_text()) if args.merge else None
    start = time.perf_counter()
    runs, unbuilt, broken = plan(set(args.only.split(",")) if args.only else None)
    results: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="modular-survey-") as tmp:
        for i, (name, model, integration) in enumerate(runs):
            where = build_local(model, Path(tmp) / f"{name}-model")
            r = run_one(name, where, integration, args.device, Path(tmp) / f"run-{i}")
            r["model"] = model
            results.append((name, r))
            print(f"{name} ({model}): {r.get('cells') or r.get('reason')} ({r['wall_s']:.0f} s)", file=sys.stderr)
    for name in unbuilt:
        results.append((name, {"built": "no", "reason": f"no tiny offline builder; the default blocks load "
                                                        f"{needs(name)}"}))
    for model, why in broken.items():
        results.append(("(twin of " + model + ")", {"built": "no", "reason": why}))
    wall = time.perf_counter() - start
    runs_done = [{"command": None, "wall_s": wall}]
    if previous is not None:  # keep the earlier rows of everything not run now
        ran = {(n, r.get("model")) for n, r in results} | {n for n, r in results}
        results += [(n, r) for n, r in previous["results"] if (n, r.get("model")) not in ran
                    and not (r.get("model") is None and n in ran)]
        runs_done = [*previous.get("runs", [{"command": previous.get("command"), "wall_s": previous["wall_s"]}]),
                     *runs_done]
    shown = f"python benchmarks/modular_survey.py --device {args.device}"
    shown += f" --only {args.only}" if args.only else ""
    runs_done[-1]["command"] = f"OMP_NUM_THREADS=1 {shown}" + (f" --merge {args.merge.name}" if args.merge else "")
    write(results, runs_done, args.device, args.out)
    return 0


def write(results: list, runs_done: list[dict], device: str, out: Path) -> None:
    """modular_survey.json and modular_survey.md in `out` (the reason column from NOTES where it classifies a gap)."""
    import diffusers

    lines = [f"# Modular pipeline survey (diffusers {diffusers.__version__}, {device})", "",
             *[f"Command: `{r['command']}`; wall time {r['wall_s']:.0f} s." for r in runs_done], "",
             _summary(results), "",
             "| pipeline | built | " + " | ".join(ROWS) + " | reason |", "|---" * (len(ROWS) + 3) + "|"]
    for name, r in sorted(results, key=lambda item: (item[0], item[1].get("model") or "")):
        cells = r.get("cells", {})
        reason = NOTES.get(f"{name}@{r.get('model')}") or NOTES.get(name) or r.get("reason", "")
        built = r["built"] + (f" ({r['model']}, {r['wall_s']:.0f} s)" if r.get("model") else "")
        lines.append(f"| {name} | {built} | " + " | ".join(_cell(cells.get(row, "–")) for row in ROWS)
                     + f" | {reason} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "modular_survey.json").write_text(json.dumps({"wall_s": sum(r["wall_s"] for r in runs_done),
                                                         "device": device, "runs": runs_done,
                                                         "results": results}, indent=2) + "\n")
    (out / "modular_survey.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _summary(results: list) -> str:
    built = [r for _, r in results if r.get("cells")]
    ok = {row: sum(r["cells"].get(row) in ("passed", "reference") for r in built) for row in ROWS}
    classes = {n for n, r in results if r.get("cells")}
    unbuilt = sorted({n for n, r in results if not r.get("cells")})
    return (f"{len(built)} models of {len(classes)} classes built and run; rows that passed: "
            + ", ".join(f"{row} {n} of {len(built)}" for row, n in ok.items())
            + f". Not built: {len(unbuilt)} (the reason says what a tiny builder would load, or why not).")


def _cell(status: str) -> str:
    """A row's status, its error cut to the exception (the reason column says the rest)."""
    return status if len(status) <= 90 else status[:87] + "..."


if __name__ == "__main__":
    sys.exit(main())
