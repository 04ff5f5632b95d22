"""Every ModularPipeline class of the installed diffusers, run through ditgate's rows where a tiny one can be built.

    python benchmarks/modular_survey.py [--only Flux3ModularPipeline,...] [--device cpu|cuda] [--out DIR]

For each class diffusers exports (`*ModularPipeline`), the survey looks for a tiny seeded offline model:
- a model built as the modular class itself (zoo:flux3, and the distilled FLUX.3 built here by
  `ditgate.zoo.modular_builders.build_flux3(distilled=True)`: no standard class exists), or
- a standard zoo model whose folder diffusers maps to the class (`ModularPipeline.from_pretrained` on its
  `model_index.json`), loaded with `--pipeline diffusers:<Class>`.
A class with neither is classified by the components its default blocks expect (what a tiny builder would need).
Each built model runs the rows baseline, cache, cp-ulysses-2 and tp-2 with `ditgate run` (one run per model, the
integration file where one exists) and each cell is the row's status: passed, failed, error, or its first reason.

Writes DIR/modular_survey.json and DIR/modular_survey.md (default benchmarks/results/) and prints the table with
the survey's wall time.
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
# modular class -> (model, integration file or None). Standard zoo folders are run through their modular class.
BUILT = {
    "Flux3ModularPipeline": ("zoo:flux3", ROOT / "examples" / "flux3" / "integration.py"),
    "Flux3DistilledModularPipeline": ("flux3-distilled", ROOT / "examples" / "flux3" / "integration.py"),
    "FluxModularPipeline": ("zoo:flux", None),
    "WanModularPipeline": ("zoo:wan", None),
    "QwenImageModularPipeline": ("zoo:qwen-image", None),
}

MODULAR_ONLY = {"Flux3ModularPipeline", "Flux3DistilledModularPipeline"}


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


def run_one(name: str, model: str, integration: Path | None, device: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "ditgate", "run", model, "--rows", ",".join(ROWS), "--out", str(out),
           "--device", device, "--json"]
    if name not in MODULAR_ONLY:  # a standard folder, run through its modular class
        cmd += ["--pipeline", f"diffusers:{name}"]
    if integration is not None:
        cmd += ["--integration", str(integration)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        return {"built": "no", "reason": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    report = json.loads(proc.stdout)
    cells = {}
    for row in report["rows"]:
        status = row["status"]
        if status in ("failed", "error"):
            why = (row.get("error") or {}).get("message") or "; ".join(row.get("reasons") or [])
            status = f"{status}: {why[:120]}"
        cells[row["name"]] = status
    return {"built": "yes", "cells": cells, "wall_s": wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated class names")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    start = time.perf_counter()
    names = modular_classes()
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="modular-survey-") as tmp:
        for name in names:
            if name in BUILT:
                model, integration = BUILT[name]
                where = build_local(model, Path(tmp) / f"{name}-model")
                results[name] = run_one(name, where, integration, args.device, Path(tmp) / name)
                results[name]["model"] = model
            else:
                results[name] = {"built": "no", "reason": f"no tiny offline builder; the default blocks load {needs(name)}"}
            print(f"{name}: {results[name].get('built')} ({results[name].get('wall_s', 0):.0f} s)", file=sys.stderr)
    wall = time.perf_counter() - start
    import diffusers

    lines = [f"# Modular pipeline survey (diffusers {diffusers.__version__}, {args.device})", "",
             f"Command: `python benchmarks/modular_survey.py --device {args.device}`; wall time {wall:.0f} s.", "",
             "| pipeline | built | " + " | ".join(ROWS) + " | reason |", "|---" * (len(ROWS) + 3) + "|"]
    for name, r in results.items():
        cells = r.get("cells", {})
        lines.append(f"| {name} | {r['built']}" + (f" ({r['model']})" if r.get("model") else "") + " | "
                     + " | ".join(cells.get(row, "–") for row in ROWS) + f" | {r.get('reason', '')} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "modular_survey.json").write_text(json.dumps({"wall_s": wall, "device": args.device,
                                                              "results": results}, indent=2) + "\n")
    (args.out / "modular_survey.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
