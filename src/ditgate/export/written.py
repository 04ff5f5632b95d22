"""What an export writes besides code: the twin's config folder and the test that runs on it (cache-dit's tests/),
and the `cache-dit-generate` example entry (`_utils/examples.py`).

The test is `ditgate/export/pertest.py` with its constants filled in: the twin's call, which rows to run (those the
proving run passed), the tensor rule's value from checklists/gates.json with its source. The twin folder holds every
file of the twin but its weights (the test draws them from the configs, seeded), and, for a model outside diffusers,
the packages its classes come from (`code/`).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

from ditgate.export.compose import Names
from ditgate.export.tree import ExportError, Tree

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
_LIBRARIES = ("diffusers", "transformers", "torch")
TEMPLATE = Path(__file__).with_name("pertest.py")


def tests_prefix(tree: Tree) -> str:
    """Where tests go, relative to the tree: a checkout's tests/ beside src/, else DIR/tests/."""
    return "../tests" if tree.root.name == "src" and (tree.root.parent / "tests").is_dir() else "tests"


def twin_folder(tree: Tree, names: Names, twin_dir: Path, exclude: set[Path] = frozenset()) -> str:
    """Stage the twin's files (no weights, no ditgate.json) and its code packages; the folder's relative path."""
    rel = f"{tests_prefix(tree)}/{names.slug}_twin"
    for file in sorted(twin_dir.rglob("*")):
        if not file.is_file() or file.name.endswith(WEIGHTS) or file.name == "ditgate.json" or ".index." in file.name:
            continue
        data = _text_or_bytes(file.read_bytes())
        if file.name == "modular_model_index.json":  # the twin's own folder is not where the test finds it
            data = data.replace(json.dumps(str(twin_dir))[1:-1], ".")
        tree.files[f"{rel}/{file.relative_to(twin_dir)}"] = data
    loaded = {Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    loaded -= {Path(p).resolve() for p in exclude}  # the integration file itself never travels
    for package in code_packages(twin_dir):
        for file in sorted(package.rglob("*.py")):  # the package's modules the model imported, not its other files
            if file.resolve() in loaded:
                tree.files[f"{rel}/code/{package.name}/{file.relative_to(package)}"] = file.read_text()
    return rel


def _text_or_bytes(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def code_packages(twin_dir: Path) -> list[Path]:
    """The packages outside the installed libraries that the model's classes come from, and those they import
    from the same folder (zoo:tinymoe's package imports zoo:tinymm's)."""
    index_file = twin_dir / "model_index.json"
    if not index_file.is_file():
        index_file = twin_dir / "modular_model_index.json"
    index = json.loads(index_file.read_text())
    specs = [index.get("_class_name")] + [v for k, v in index.items() if not k.startswith("_")]
    tops = {s[0].split(".")[0] for s in specs if isinstance(s, list) and s and s[0]}
    tops -= set(_LIBRARIES)
    found: dict[str, Path] = {}
    for top in sorted(tops):
        try:
            module = importlib.import_module(top)
        except ImportError:
            continue
        if getattr(module, "__file__", None) and Path(module.__file__).name == "__init__.py" \
                and "site-packages" not in module.__file__:
            found[top] = Path(module.__file__).parent
    folders = {p.parent for p in found.values()}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if "." in name or not file or Path(file).name != "__init__.py":
            continue
        if Path(file).parent.parent in folders:
            found.setdefault(name, Path(file).parent)
    return [found[k] for k in sorted(found)]


def tensor_rule() -> tuple[float, str]:
    from ditgate.gates.verdicts import load_gates

    check = next(c for c in load_gates()["rules"]["tensor"]["checks"] if c["metric"] == "max_abs")
    return float(check["value"]), check["source"]


def test_file(names: Names, twin_rel: str, call: dict, seed: int, parallel: dict[str, dict], cached: bool,
              cache: dict, origin: str) -> str:
    """The rendered test: the template's imports and body, this model's docstring and constants."""
    template = TEMPLATE.read_text()
    imports = template.split("# -- imports --\n")[1].split("# -- constants --\n")[0]
    body = template.split("# -- body --\n")[1]
    value, source = tensor_rule()
    rows = ", ".join(sorted(parallel)) or "none"
    doc = (f'"""{names.prefix} in cache-dit: caching and context/tensor parallelism on the model\'s twin, in float32 '
           "on the CPU with gloo.\n\n"
           f"The twin is {names.pipeline_class} rebuilt small from the config folder beside this file "
           f"({Path(twin_rel).name}/): every width, head count and patch size of the real model, one block of each "
           "kind, seeded float32 weights drawn from the configs (no weight file, no hub).\n\n"
           "- caching off (the registered BlockAdapter and its functors, every step computed) matches the baseline "
           "by the tensor rule, and with a static schedule cache-dit reports cached steps;\n"
           f"- parallel rows ({rows}): the final latents of two forked ranks match the single-process baseline by "
           "the tensor rule, and the feature acted (a CP plan applied, weights sharded).\n\n"
           f"Tensor rule: max |candidate - baseline| <= {value:g} x max |baseline| over the final latents "
           f"(ditgate's checklists/gates.json, rules.tensor; source: {source}).\n\n"
           f"Written by `ditgate export` from {origin}; needs torch, diffusers, transformers and cache_dit only.\n"
           '"""\n\n')
    doc = "\n".join(_wrap(line) for line in doc.split("\n"))
    consts = "\n".join([
        "HERE = Path(__file__).resolve().parent",
        f'TWIN = HERE / "{Path(twin_rel).name}"  # the twin\'s config folder (configs, scheduler, tokenizer; no '
        "weights)",
        f"CALL = {json.dumps(call, sort_keys=True)}  # the pipeline call",
        f"SEED = {int(seed)}",
        f"TENSOR_RULE = {value!r}  # max |candidate - baseline| <= TENSOR_RULE x max |baseline| (gates.json "
        "rules.tensor)",
        f"CACHE = {json.dumps(cache, sort_keys=True)}  # DBCacheConfig fields of the cache row",
        f"PARALLEL = {json.dumps(parallel, sort_keys=True)}  # the parallel rows the proving run passed",
        f"CACHED = {bool(cached)}  # the model registers a BlockAdapter",
    ])
    return doc + imports + "\n" + consts.replace(": true", ": True").replace(": false", ": False") \
        .replace(": null", ": None") + "\n\n\n" + body.lstrip("\n")


def _wrap(line: str, width: int = 100) -> str:
    """A docstring line wrapped at `width` (a bullet's continuation indented under its text)."""
    import textwrap

    indent = "  " if line.startswith("- ") else ""
    return textwrap.fill(line, width=width, subsequent_indent=indent, break_on_hyphens=False) if line else line


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_model_id(model_id: str, where: str = "--model-id") -> str:
    """`model_id` when it is a hub id (`NAME` or `ORG/NAME`): it is written into cache-dit's examples.py as a string,
    so quotes, backslashes, new lines or `..` would change the code the tree runs."""
    if not _HUB_ID.fullmatch(model_id) or ".." in model_id:
        raise ExportError(f"{where} {model_id!r} is not a hub id (NAME or ORG/NAME of letters, digits, '.', '-', '_'); "
                          "it is written into cache-dit's examples.py: pass --model-id ORG/NAME")
    return model_id


def example_entry(names: Names, model_id: str, modality: str, pipeline_module: str, call: dict,
                  trust_remote_code: bool, image_input: bool) -> tuple[str | None, str | None]:
    """The `@ExampleRegister.register` function for cache-dit-generate, or why none is written."""
    if modality not in ("image", "video"):
        return None, (f"cache-dit-generate has no task type for {modality} (ExampleType lists T2I, T2V, I2V, IE2I, "
                      "FLF2V, VACE): upstream would need an audio task type and its output writer in "
                      "_utils/registers.py before an example can be registered")
    if image_input:
        return None, ("the pipeline takes an input image: cache-dit-generate's I2V/IE2I examples load it from a URL "
                      "or file per model; write its ExampleInputData.image by hand")
    check_model_id(model_id)
    task = "T2I" if modality == "image" else "T2V"
    env = f"{names.slug.upper()}_DIR"
    inputs = [f"      {key}={value!r}," for key, value in sorted(call.items())
              if key in ("prompt", "negative_prompt", "height", "width", "num_inference_steps", "guidance_scale",
                         "num_frames")]
    extra = {k: v for k, v in call.items() if k in ("max_sequence_length",)}
    if extra:
        inputs.append(f"      extra_input_kwargs={extra!r},")
    lines = [f'@ExampleRegister.register("{names.slug}", default="{model_id}")',
             f"def {names.slug}_example(args: argparse.Namespace, **kwargs) -> Example:",
             f"  from {pipeline_module} import {names.pipeline_class}", "",
             "  return Example(", "    args=args,", "    init_config=ExampleInitConfig(",
             f"      task_type=ExampleType.{task},",
             f'      model_name_or_path=_path("{model_id}", args=args, ENV="{env}"),',
             f"      pipeline_class={names.pipeline_class},"]
    if trust_remote_code:
        lines.append("      trust_remote_code=True,")
    lines += ["    ),", "    input_data=ExampleInputData(", *inputs, "    ),", "  )"]
    return "\n".join(lines) + "\n", None
